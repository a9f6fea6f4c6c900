"""A pipeline table's entry in the Spark session's catalog (`table.name: schema.table`), for either engine.

The entry is delta-spark's own (`CREATE TABLE … USING delta LOCATION …` through its catalog), so Spark SQL,
`spark.table` and `DESCRIBE HISTORY` find the table by name, and the Delta log stays the one truth: the
entry holds the location and a copy of the schema and properties, which delta-spark's catalog hook
(`UpdateCatalog`) rewrites from the log. Whatever catalog the session has (a Hive Metastore, Unity Catalog,
AWS Glue) is the one written.

A name that already belongs to a table somewhere else is refused before anything is written, in one line:
two pipelines, or a pipeline and a user's table, never share a name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

from offsetlake.config import PipelineConfig
from offsetlake.engine import spark_transaction
from offsetlake.errors import OffsetlakeError, TableError, one_line

LAST_UPDATE_VERSION = "delta.lastUpdateVersion"  # the log version delta-spark's hook last copied


def check(spark: Any, cfg: PipelineConfig) -> Any:
    """Refuse a `table.name` the catalog gives to another location (before the table is created). Returns
    the catalog's entry under that name (a `CatalogTable`), or None while there is none."""
    name = cfg.table.name
    assert name is not None
    spark_transaction.check_on_classpath(spark)
    with _answered(name):
        entry = _entry(spark, name)
        registered = _location(entry) if entry is not None else None
    if registered is not None and _same_place(registered) != _same_place(cfg.table_location.uri):
        raise TableError(
            f"table.name {name} is the catalog's name for {registered}, not for {cfg.table_path}; "
            f"nothing was written: choose another name, or drop that entry"
        )
    return entry


def register(spark: Any, cfg: PipelineConfig, version: int, entry: Any = None) -> None:
    """The table under `table.name` (its schema made if missing), and the entry's copy of its schema and
    properties brought up to the log's when it is older than `version` (the table's newest, as the caller
    read it): on an idle stream each batch only reads the entry. `entry`: the one `check` returned, if the
    caller has it (else it is looked up)."""
    name = cfg.table.name
    assert name is not None
    with _answered(name):
        _register(spark, cfg, name, version, entry if entry is not None else _entry(spark, name))


@contextmanager
def _answered(name: str) -> Iterator[None]:
    """A catalog that fails (unreachable, refusing) fails the job in one line; a committed batch stays."""
    try:
        yield
    except OffsetlakeError:
        raise
    except Exception as err:
        cause = "; ".join(line.strip() for line in str(err).splitlines()[:2] if line.strip())
        raise TableError(f"table.name {name}: the Spark session's catalog failed: {one_line(cause)}") from err


def _register(spark: Any, cfg: PipelineConfig, name: str, version: int, entry: Any) -> None:
    if entry is None:
        schema, table = name.split(".")
        spark.sql(f"CREATE SCHEMA IF NOT EXISTS {_quoted(schema)}")
        location = cfg.table_location.uri.replace("'", "\\'")
        spark.sql(f"CREATE TABLE IF NOT EXISTS {_quoted(schema)}.{_quoted(table)} USING delta LOCATION '{location}'")
        entry = _entry(spark, name)
    copied = entry.properties().get(LAST_UPDATE_VERSION)
    if copied.isDefined() and int(copied.get()) >= version:
        return
    # delta-spark's catalog hook, run now: the entry's schema and properties from the newest snapshot.
    jvm, session = spark._jvm, spark._jsparkSession
    snapshot = spark_transaction.start(spark, cfg.table_location.uri).snapshot()
    hook = jvm.org.apache.spark.sql.delta.hooks.UpdateCatalogFactory.getUpdateCatalogHook(entry, session)
    hook.updateSchema(session, snapshot)


def _entry(spark: Any, name: str) -> Any:
    """The session catalog's `CatalogTable` under `name`, or None."""
    catalog = spark._jsparkSession.sessionState().catalog()
    identifier = _identifier(spark, name)
    return catalog.getTableMetadata(identifier) if catalog.tableExists(identifier) else None


def _location(entry: Any) -> str:
    location = entry.storage().locationUri()
    return str(location.get()) if location.isDefined() else ""


def _identifier(spark: Any, name: str) -> Any:
    schema, table = name.split(".")
    jvm = spark._jvm
    return jvm.org.apache.spark.sql.catalyst.TableIdentifier.apply(table, jvm.scala.Some.apply(schema))


def _same_place(uri: str) -> str:
    """A location as the catalog and offsetlake may each write it: `file:/x/`, `file:///x`, `/x` alike."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return parsed.path.rstrip("/")
    return uri.rstrip("/")


def _quoted(identifier: str) -> str:
    return "`" + identifier.replace("`", "``") + "`"

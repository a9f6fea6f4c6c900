"""A Hive Metastore: the catalog a Spark session finds tables in by name (`lake.orders`), started with a pid
file, stopped by PID.

Apache Hive's standalone metastore server (poms/hive-metastore.xml), one JVM, its Thrift service bound to
127.0.0.1, its database on a PostgreSQL server (offsetlake_local.postgres). An empty database gets Hive's own
PostgreSQL schema script first (from the server's `-bin` archive, as Hive's schematool would run it); the
server checks the schema's version when it starts. A Spark session reaches it through the settings
`spark_conf` gives, which also load Hive 4's client (poms/hive-client.xml): Spark's built-in client is Hive
2.3's, whose calls Hive 4's server no longer answers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from offsetlake.errors import OffsetlakeError
from offsetlake_local import jars, jvm, processes
from offsetlake_local.broker import free_port
from offsetlake_local.postgres import Postgres

MARKER = "org.apache.hadoop.hive.metastore.HiveMetaStore"
HIVE_VERSION = "4.0.1"  # poms/hive-metastore.xml and poms/hive-client.xml
SCHEMA_SCRIPT = "scripts/metastore/upgrade/postgres/hive-schema-4.0.0.postgres.sql"
HEAP = "384m"
START_TIMEOUT_SECONDS = 120
CONF_DIR = "conf"


class MetastoreError(OffsetlakeError):
    """The metastore did not start, or its database could not be prepared (the message says which)."""


@dataclass
class Metastore:
    """A running metastore: `pid` is the JVM's; its configuration, log and warehouse are in `work_dir`."""

    pid: int
    port: int
    work_dir: Path
    process: subprocess.Popen | None = field(default=None, repr=False, compare=False)

    @property
    def uri(self) -> str:
        return f"thrift://127.0.0.1:{self.port}"

    @property
    def warehouse(self) -> Path:
        return self.work_dir / "warehouse"

    @property
    def log(self) -> Path:
        return self.work_dir / "metastore.log"

    def spark_conf(self) -> dict[str, str]:
        return spark_conf(self.uri, self.warehouse)

    def stop(self) -> None:
        processes.stop(self.pid, timeout=30)


def spark_conf(uri: str, warehouse: Path | str) -> dict[str, str]:
    """The Spark settings of a session whose catalog is the metastore at `uri` (`thrift://host:port`): Hive's
    catalog, Hive 4's client from the cache (poms/hive-client.xml), and delta-spark keeping the metastore's
    copy of a Delta table's schema and properties current after each of its commits."""
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.hadoop.hive.metastore.uris": uri,
        "spark.sql.warehouse.dir": str(warehouse),
        "spark.sql.hive.metastore.version": HIVE_VERSION,
        "spark.sql.hive.metastore.jars": "path",
        "spark.sql.hive.metastore.jars.path": f"file://{jars.jar_dir('hive-client')}/*.jar",
        "spark.databricks.delta.catalog.update.enabled": "true",
    }


def start(work_dir: Path | str, database: Postgres, pid_file: Path | None = None) -> Metastore:
    """A metastore keeping its catalog in `database` (a server of offsetlake_local.postgres; the database
    `metastore` on it, made and given Hive's schema if missing). Started again on the same `work_dir`, it
    keeps its port. `pid_file`: for another process to stop it (`stop_from_pid_file`)."""
    work = Path(work_dir)
    (work / CONF_DIR).mkdir(parents=True, exist_ok=True)
    site = work / CONF_DIR / "metastore-site.xml"
    port = _port(site) if site.exists() else free_port()
    _prepare(database)
    site.write_text(_site(database, port, work / "warehouse"))
    (work / "log4j2.properties").write_text(jvm.log4j2(work / "metastore.log", ("org.apache.hadoop.hive.metastore",)))
    command = jvm.command("hive-metastore", HEAP, work / "log4j2.properties", "-Xms64m")
    command[command.index("-cp") + 1] = f"{work / CONF_DIR}:{command[command.index('-cp') + 1]}"
    with open(work / "metastore.out", "ab") as out:
        proc = subprocess.Popen(
            [*command, MARKER],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    if pid_file is not None:
        pid_file.write_text(f"{proc.pid}\n")
    metastore = Metastore(proc.pid, port, work, proc)
    try:
        _wait(metastore, proc)
    except MetastoreError:
        processes.stop(proc.pid)
        raise
    return metastore


def _prepare(server: Postgres) -> None:
    """The database `metastore` with Hive's schema, made once."""
    conn = server.connect("postgres")
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = 'metastore'")
            if cur.fetchone() is None:
                cur.execute("CREATE DATABASE metastore")
    finally:
        conn.close()
    conn = server.connect("metastore")
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass('public.\"VERSION\"') IS NOT NULL")
            if not cur.fetchone()[0]:
                cur.execute(_schema_script())
    finally:
        conn.close()


def _schema_script() -> str:
    archive = next(jars.jar_dir("hive-metastore").glob("hive-standalone-metastore-server-*-bin.tar.gz"), None)
    if archive is None:
        raise MetastoreError("the Hive Metastore's -bin archive is not in its resolved stack (make jars)")
    with tarfile.open(archive) as tar:
        member = next((m for m in tar.getmembers() if m.name.endswith(SCHEMA_SCRIPT)), None)
        if member is None:
            raise MetastoreError(f"{archive.name} holds no {SCHEMA_SCRIPT}")
        script = tar.extractfile(member)
        assert script is not None
        return script.read().decode()


def _site(database: Postgres, port: int, warehouse: Path) -> str:
    settings = {
        "javax.jdo.option.ConnectionURL": f"jdbc:postgresql://127.0.0.1:{database.port}/metastore",
        "javax.jdo.option.ConnectionDriverName": "org.postgresql.Driver",
        "javax.jdo.option.ConnectionUserName": database.user,
        "javax.jdo.option.ConnectionPassword": "",
        # The schema is Hive's own script's (_prepare): never DataNucleus' guesses, and checked at start.
        "datanucleus.schema.autoCreateAll": "false",
        "metastore.schema.verification": "true",
        "metastore.thrift.bind.host": "127.0.0.1",
        "metastore.thrift.port": str(port),
        "metastore.warehouse.dir": warehouse.as_uri(),
        # Hive 4 rewrites tables for clients that declare no capabilities (Spark's); a Delta table stays as
        # Spark registered it.
        "metastore.metadata.transformer.class": " ",
    }
    properties = "".join(
        f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>\n" for k, v in settings.items()
    )
    return f"<configuration>\n{properties}</configuration>\n"


def _port(site: Path) -> int:
    """The Thrift port an earlier start wrote into the site file."""
    ports = [
        p.findtext("value") for p in ElementTree.parse(site).getroot() if p.findtext("name") == "metastore.thrift.port"
    ]
    return int(ports[0] or "")


def _wait(metastore: Metastore, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        if proc.poll() is not None:
            raise MetastoreError(f"the Hive Metastore exited ({proc.returncode}); see {metastore.work_dir}")
        try:
            socket.create_connection(("127.0.0.1", metastore.port), timeout=1).close()
            return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise MetastoreError(f"the Hive Metastore did not listen within {START_TIMEOUT_SECONDS}s")
        time.sleep(0.5)


def stop_from_pid_file(pid_file: Path | str) -> bool:
    return processes.stop_from_pid_file(Path(pid_file), MARKER, timeout=30.0)


def properties_file(metastore: Metastore) -> Path:
    """The session settings that reach `metastore`, with delta-spark's, as a Spark properties file
    (`pyspark --properties-file`, `spark-submit --properties-file`), written beside it."""
    from offsetlake.spark.session import delta_spark_conf

    settings = {**delta_spark_conf({}), **metastore.spark_conf()}
    path = metastore.work_dir / "spark-catalog.conf"
    path.write_text("".join(f"{key} {value}\n" for key, value in settings.items()))
    return path


def submit_args(metastore: Metastore) -> str:
    """`PYSPARK_SUBMIT_ARGS` of a process whose Spark session reaches `metastore`, delta-spark in it."""
    return f"--properties-file {properties_file(metastore)} {jars.delta_spark_jars_arg()} pyspark-shell"


def register(metastore: Metastore, names: dict[str, str]) -> None:
    """Register pipelines' tables under names ({`schema.table`: pipeline}) in `metastore`, in one Spark
    session of a process of its own (delta-spark's jars given as `--jars`), as a job with `table.name` would."""
    args = [f"{name}={pipeline}" for name, pipeline in names.items()]
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS": submit_args(metastore), "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, "-m", "offsetlake_local.metastore", *args], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise MetastoreError(
            f"registering {', '.join(names)} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
        )


def main(argv: list[str]) -> int:
    """`python -m offsetlake_local.metastore schema.table=pipeline …` in a session that reaches the catalog."""
    from offsetlake.config import load_pipeline
    from offsetlake.engine import catalog
    from offsetlake.spark.session import build_session

    spark = build_session("offsetlake-register", "local[1]")
    try:
        for arg in argv:
            name, pipeline = arg.split("=", 1)
            cfg = load_pipeline(pipeline)
            cfg = cfg.model_copy(update={"table": cfg.table.model_copy(update={"name": name})})
            entry = catalog.check(spark, cfg)
            catalog.register(spark, cfg, cfg.table_location.delta_table().version(), entry)
            print(f"{name}: {cfg.table_path}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

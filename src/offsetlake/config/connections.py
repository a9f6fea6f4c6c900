"""Credentials from Airflow connections: `kafka.connection`, `format.registry.connection` and
`table.connection` (and the quarantine's).

Airflow users keep Kafka and registry credentials in Airflow connections (the metadata database or a
secrets backend), not in environment variables of every worker. A pipeline names them; they are read
through Airflow's own API (`BaseHook.get_connection`, which asks the secrets backends first) **in the
process that runs the Airflow task**, and reach the Spark job like this:

- the operator resolves the pipeline's connections and writes them to a file only its user can read
  (0600, in a fresh 0700 directory), passes the file's *path* to spark-submit in the environment variable
  `OFFSETLAKE_CONNECTIONS_FILE`, and deletes the directory when spark-submit ends. No secret is on a
  command line (`ps`), in spark-submit's environment, in Spark's configuration (UI, event log), in a task
  log or in XCom. (Airflow also masks a connection's password in task logs once it was read.)
- the job (the Spark driver, in client deploy mode on the task's host) reads that file when it loads the
  pipeline. The executors get the resolved settings inside the pickled task, as they get every other
  pipeline setting: nothing is written on their hosts.

Outside an Airflow task (the CLI, the DAG processor) nothing is resolved unless the file or Airflow is
there: a pipeline with a connection then fails with one line naming it. The `${ENV}` way stays for the CLI.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from offsetlake.config.format_settings import RegistrySettings
from offsetlake.config.model import RESERVED_CLIENT_KEYS, KafkaSettings, PipelineConfig, TableSettings
from offsetlake.errors import ConfigError

CONNECTIONS_FILE_ENV = "OFFSETLAKE_CONNECTIONS_FILE"


def connection_ids(cfg: PipelineConfig) -> list[str]:
    """The Airflow connections the pipeline names, Kafka's first."""
    registry = cfg.format.registry
    tables = [cfg.table.connection, cfg.quarantine.connection if cfg.quarantine else None]
    ids = [cfg.kafka.connection, registry.connection if registry else None, *tables]
    return list(dict.fromkeys(i for i in ids if i))


def fetch_from_airflow(conn_id: str) -> dict[str, Any]:
    """One connection through Airflow's API (secrets backends, then the metadata database), as plain data."""
    try:
        from airflow.sdk import BaseHook
    except ImportError as err:
        raise ConfigError(f"Airflow connection {conn_id!r}: Airflow is not installed here") from err
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as err:  # noqa: BLE001 - Airflow raises its own types; one line for the user
        raise ConfigError(
            f"Airflow connection {conn_id!r} cannot be read: {type(err).__name__}: {' '.join(str(err).split())[:200]}"
        ) from err
    return {
        "conn_type": conn.conn_type,
        "host": conn.host,
        "port": conn.port,
        "schema": conn.schema,
        "login": conn.login,
        "password": conn.password,
        "extra": conn.extra_dejson,
    }


def write_connections_file(directory: Path, connections: dict[str, dict[str, Any]]) -> Path:
    """The file the operator hands to its spark-submit: readable by this user only."""
    path = directory / "connections.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(connections, f)
    return path


def read_connections(cfg: PipelineConfig) -> dict[str, dict[str, Any]]:
    """Every connection the pipeline names, read through Airflow once: what the operator hands to its job."""
    return {conn_id: fetch_from_airflow(conn_id) for conn_id in connection_ids(cfg)}


def _handed_over() -> dict[str, dict[str, Any]]:
    """The connections the operator's task wrote for this job ({} outside such a job)."""
    path = os.environ.get(CONNECTIONS_FILE_ENV)
    if not path:
        return {}
    try:
        handed: dict[str, dict[str, Any]] = json.loads(Path(path).read_text())
        return handed
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{CONNECTIONS_FILE_ENV}={path}: cannot read the connections the Airflow task "
            f"resolved ({type(err).__name__})"
        ) from err


def resolve_connections(cfg: PipelineConfig, given: dict[str, dict[str, Any]] | None = None) -> PipelineConfig:
    """`cfg` with its Airflow connections applied (itself when it names none). Each comes from `given` (read
    already), else from the file the operator handed to this job, else through Airflow where this runs."""
    ids = connection_ids(cfg)
    if not ids:
        return cfg
    found = given if given is not None else _handed_over()
    conns = {conn_id: found[conn_id] if conn_id in found else fetch_from_airflow(conn_id) for conn_id in ids}
    update: dict[str, Any] = {}
    if cfg.kafka.connection:
        update["kafka"] = _kafka(cfg, conns[cfg.kafka.connection])
    registry = cfg.format.registry
    if registry is not None and registry.connection:
        update["format"] = cfg.format.model_copy(update={"registry": _registry(registry, conns[registry.connection])})
    for key in ("table", "quarantine"):
        table = getattr(cfg, key)
        if table is not None and table.connection:
            update[key] = _object_store(table, conns[table.connection])
    return cfg.model_copy(update=update)  # its table_location now holds the credentials


def _kafka(cfg: PipelineConfig, conn: dict[str, Any]) -> KafkaSettings:
    """The Kafka provider's connection: librdkafka settings in its extra. The protocol's own keys
    (group.id, isolation.level...) are offsetlake's and are left out; the pipeline's `client` wins."""
    extra = {str(k): v for k, v in (conn.get("extra") or {}).items()}
    bootstrap = cfg.kafka.bootstrap_servers or extra.get("bootstrap.servers")
    if not bootstrap:
        raise ConfigError(
            f"pipeline {cfg.name}: Airflow connection {cfg.kafka.connection!r} has no "
            f"bootstrap.servers in its extra, and kafka.bootstrap_servers is not set"
        )
    settings = {k: v for k, v in extra.items() if k not in RESERVED_CLIENT_KEYS}
    return cfg.kafka.model_copy(
        update={"bootstrap_servers": str(bootstrap), "client": {**settings, **cfg.kafka.client}}
    )


def _object_store(table: TableSettings, conn: dict[str, Any]) -> TableSettings:
    """The amazon provider's `aws` connection: login and password are the access key and secret; extra
    `region_name`, `endpoint_url` (also as `service_config.s3.endpoint_url`) and `aws_session_token`. An
    `http://` endpoint (an S3-compatible store on premises) is allowed plain HTTP. The pipeline's own
    storage_options win, so a connection can be shared by pipelines that differ in a setting."""
    extra = conn.get("extra") or {}
    s3_config = (extra.get("service_config") or {}).get("s3") or {}
    endpoint = extra.get("endpoint_url") or s3_config.get("endpoint_url") or conn.get("host")
    found = {
        "AWS_ACCESS_KEY_ID": conn.get("login"),
        "AWS_SECRET_ACCESS_KEY": conn.get("password"),
        "AWS_SESSION_TOKEN": extra.get("aws_session_token"),
        "AWS_REGION": extra.get("region_name"),
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true" if str(endpoint or "").startswith("http://") else None,
    }
    if not found["AWS_ACCESS_KEY_ID"] and not found["AWS_SESSION_TOKEN"]:
        raise ConfigError(f"Airflow connection {table.connection!r} has no login (the access key id) for {table.path}")
    given = {k.lower() for k in table.storage_options}
    options = {k: str(v) for k, v in found.items() if v and k.lower() not in given}
    return table.model_copy(update={"storage_options": {**options, **table.storage_options}})


def _registry(registry: RegistrySettings, conn: dict[str, Any]) -> RegistrySettings:
    """An HTTP connection: host (a URL, or a host name with schema and port) and basic auth."""
    url = registry.url or _url(conn)
    if not url:
        raise ConfigError(f"Airflow connection {registry.connection!r} has no host, and format.registry.url is not set")
    auth: dict[str, Any] = {}
    if conn.get("login"):
        auth = {"username": SecretStr(conn["login"]), "password": SecretStr(conn.get("password") or "")}
    return registry.model_copy(update={"url": url, **auth})


def _url(conn: dict[str, Any]) -> str | None:
    host = conn.get("host")
    if not host:
        return None
    if "://" not in host:
        host = f"{conn.get('schema') or 'http'}://{host}"
    return f"{host}:{conn['port']}" if conn.get("port") else host

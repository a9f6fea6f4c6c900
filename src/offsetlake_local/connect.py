"""A Kafka Connect worker running Debezium's PostgreSQL connector: the change-data-capture chain of the tests
(PostgreSQL -> Debezium -> Kafka -> offsetlake), started with a pid file, stopped by PID.

The worker is Kafka's standalone one (`ConnectStandalone`): one JVM, its connectors given as files on its
command line, its source offsets (how far Debezium has read the database's WAL) in a file it flushes every
`offset.flush.interval.ms`. Killed, it is started again on the same directory, reads the same files, and
re-sends what it sent since its last flush: Debezium is at least once, and the pipeline downstream folds the
repeats. Its REST API (on 127.0.0.1) tells a connector's state. The jars come from Maven Central through
`offsetlake_local.jars` (`poms/kafka-connect.xml` pins Connect's runtime and Debezium).

Measured on the 2-core machine this was written on (Connect 4.3.0, Debezium 3.6.1.Final, Java 17): the REST
API answers 4-6 s after the JVM starts; Debezium's snapshot of a small database, another 2-3 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from offsetlake.errors import OffsetlakeError
from offsetlake_local import jvm, processes
from offsetlake_local.broker import free_port
from offsetlake_local.postgres import Postgres

MARKER = "org.apache.kafka.connect.cli.ConnectStandalone"
HEAP = os.environ.get("OFFSETLAKE_CONNECT_HEAP", "512m")
WORKER_CONFIG = "worker.properties"
START_TIMEOUT_SECONDS = 120


class ConnectError(OffsetlakeError):
    """The Connect worker or one of its connectors failed (the message says which, in one line)."""


@dataclass
class ConnectWorker:
    """A running worker: `pid` is the JVM's own; its files (configuration, offsets, log) are in `work_dir`."""

    pid: int
    port: int
    work_dir: Path
    process: subprocess.Popen | None = field(default=None, repr=False, compare=False)  # when we started it

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.work_dir / "connect.log"

    def status(self, connector: str) -> dict:
        """Connect's status of a connector: {"connector": {"state"...}, "tasks": [{"state", "trace"?}...]}."""
        return self._get(f"/connectors/{connector}/status")

    def running(self, connector: str) -> bool:
        """The connector and each of its tasks RUNNING; a FAILED one raises, naming the failure."""
        try:
            status = self.status(connector)
        except (OSError, urllib.error.URLError, ValueError):
            return False
        for part in [status.get("connector", {}), *status.get("tasks", [])]:
            if part.get("state") == "FAILED":
                trace = (part.get("trace") or "no trace").strip().splitlines()[0]
                raise ConnectError(f"Kafka Connect: connector {connector!r} failed: {trace} (see {self.log})")
        states = [status.get("connector", {}).get("state"), *(t.get("state") for t in status.get("tasks", []))]
        return len(states) > 1 and all(state == "RUNNING" for state in states)

    def wait_running(self, connector: str, timeout: float = START_TIMEOUT_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while not self.running(connector):
            if not self.alive():
                raise ConnectError(f"the Kafka Connect worker (pid {self.pid}) exited; see {self.log}")
            if time.monotonic() > deadline:
                raise ConnectError(f"connector {connector!r} not running within {timeout:.0f}s; see {self.log}")
            time.sleep(0.5)

    def alive(self) -> bool:
        if self.process is not None:  # our child: its exit status, not its command line (read mid-exec)
            return self.process.poll() is None
        return processes.runs(self.pid, MARKER)

    def _get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            return json.loads(response.read())

    def kill(self) -> None:
        """SIGKILL, as a crash: offsets not flushed since the last flush are lost, and re-sent on restart."""
        processes.kill(self.pid)

    def stop(self) -> None:
        processes.stop(self.pid, timeout=30)


def start(
    work_dir: Path | str,
    bootstrap_servers: str,
    connectors: dict[str, dict[str, str]] | None = None,
    schemas_enable: bool = False,
    flush_interval_ms: int = 5000,
) -> ConnectWorker:
    """A standalone worker on `work_dir` running `connectors` ({name: config}). Started again on the same
    directory, it reuses its configuration (port, converters, connectors) and offsets: a restart.
    `schemas_enable`: the JSON converter wraps each key and value as {schema, payload}."""
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    if not (work / WORKER_CONFIG).exists():
        _configure(work, bootstrap_servers, connectors or {}, schemas_enable, flush_interval_ms)
    port = int(_properties(work / WORKER_CONFIG)["listeners"].rsplit(":", 1)[1])
    connector_files = sorted(str(p) for p in work.glob("connector-*.properties"))
    with open(work / "connect.out", "ab") as out:
        proc = subprocess.Popen(
            [*_java(work), MARKER, str(work / WORKER_CONFIG), *connector_files],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    (work / "connect.pid").write_text(f"{proc.pid}\n")
    worker = ConnectWorker(proc.pid, port, work, proc)
    try:
        for name in connectors or _names(work):
            worker.wait_running(name)
    except ConnectError:
        processes.stop(proc.pid)
        raise
    return worker


def debezium_postgres(
    host: str,
    port: int,
    user: str,
    database: str,
    topic_prefix: str,
    schemas: list[str],
    password: str = "",
    partitions: int = 1,
    heartbeat_table: str | None = None,
    **overrides: str,
) -> dict[str, str]:
    """The configuration of Debezium's PostgreSQL connector capturing `schemas` of `database` into topics
    `<topic_prefix>.<schema>.<table>`, which Connect creates (`partitions` each; the embedded broker does not
    create topics on its own). TRUNCATE is sent (Debezium skips it by default). `heartbeat_table`
    (`schema.table`, with columns `id integer PRIMARY KEY, at timestamptz`): each heartbeat writes it, so the
    slot's confirmed LSN passes every earlier change even when the WAL's last records are none of the captured
    tables' (DDL, other databases). `overrides` win."""
    config = {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": host,
        "database.port": str(port),
        "database.user": user,
        "database.password": password,
        "database.dbname": database,
        "topic.prefix": topic_prefix,
        "schema.include.list": ",".join(schemas),
        "plugin.name": "pgoutput",
        "slot.name": slot_name(topic_prefix),
        "publication.name": slot_name(topic_prefix),
        # The publication is ours (create_publication: every table of the schemas, later ones included);
        # Debezium's `filtered` one lists the tables that exist when the connector starts, and never more.
        "publication.autocreate.mode": "disabled",
        "skipped.operations": "none",
        # An interval as ISO-8601 text (P1Y2M3DT4H5M6.789012S): exact. The default, microseconds as a number,
        # goes through floating point and can be a microsecond off.
        "interval.handling.mode": "string",
        # Heartbeats let Debezium confirm the server's LSN to its slot while the captured tables are quiet,
        # so the slot does not hold the database's WAL back (and "captured up to here" can be told).
        "heartbeat.interval.ms": "1000",
        # With fewer events waiting than a batch holds, Debezium sleeps this long when the replication stream
        # has nothing pending and again before it hands its queue to Connect: each change waits on both. Its
        # 500 ms default is most of a change's way to Kafka.
        "poll.interval.ms": "100",
        "topic.creation.default.replication.factor": "-1",
        "topic.creation.default.partitions": str(partitions),
    }
    if heartbeat_table is not None:
        config["heartbeat.action.query"] = (
            f"INSERT INTO {heartbeat_table} (id, at) VALUES (1, now()) ON CONFLICT (id) DO UPDATE SET at = now()"
        )
    return {**config, **overrides}


def create_publication(server: Postgres, config: dict[str, str]) -> None:
    """The publication a connector configured by `debezium_postgres` reads: every table of its schemas, those
    created later included (`FOR TABLES IN SCHEMA`, PostgreSQL 15+), so a table created while the connector
    runs is captured from its first change. Made if missing; one that lists tables instead (Debezium's
    `filtered` publication, left by an earlier demo) is set to the schemas. Needs the right to create
    publications (superuser, or CREATE on the database and ownership of the schemas' tables)."""
    name = config["publication.name"]
    wanted = sorted(s.strip() for s in config["schema.include.list"].split(","))
    schemas = ", ".join(_identifier(s) for s in wanted)
    conn = server.connect(config.get("database.dbname"))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT oid FROM pg_publication WHERE pubname = %s", (name,))
            found = cur.fetchone()
            if found is None:
                cur.execute(f"CREATE PUBLICATION {_identifier(name)} FOR TABLES IN SCHEMA {schemas}")
                return
            cur.execute(
                "SELECT n.nspname FROM pg_publication_namespace p JOIN pg_namespace n ON n.oid = p.pnnspid "
                "WHERE p.pnpubid = %s ORDER BY 1",
                (found[0],),
            )
            if [row[0] for row in cur.fetchall()] != wanted:
                cur.execute(f"ALTER PUBLICATION {_identifier(name)} SET TABLES IN SCHEMA {schemas}")
    finally:
        conn.close()


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def slot_name(topic_prefix: str) -> str:
    """The replication slot (and publication) `debezium_postgres` names for a topic prefix: PostgreSQL
    allows lower-case letters, digits and underscores only."""
    return f"offsetlake_{topic_prefix}".replace(".", "_").replace("-", "_").lower()


def converters(schemas_enable: bool) -> dict[str, str]:
    """The worker's converters: Kafka Connect's JSON converter for keys and values, with or without schemas."""
    enable = "true" if schemas_enable else "false"
    return {
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": enable,
        "value.converter.schemas.enable": enable,
    }


def _configure(
    work: Path, bootstrap_servers: str, connectors: dict[str, dict[str, str]], schemas_enable: bool, flush_ms: int
) -> None:
    config = {
        "bootstrap.servers": bootstrap_servers,
        "listeners": f"http://127.0.0.1:{free_port()}",
        **converters(schemas_enable),
        "offset.storage.file.filename": str(work / "offsets"),
        "offset.flush.interval.ms": str(flush_ms),
        # No plugin.path: Debezium is on the worker's classpath (one POM, one set of jars), and an empty one
        # would scan the working directory.
        # Debezium's producer: every event acknowledged by all in-sync replicas, resent without duplicates
        # within one worker's life (a restarted worker still re-sends what it had not flushed).
        "producer.acks": "all",
        "producer.enable.idempotence": "true",
    }
    (work / WORKER_CONFIG).write_text("".join(f"{k}={v}\n" for k, v in config.items()))
    for name, settings in connectors.items():
        lines = [f"name={name}", *(f"{k}={v}" for k, v in settings.items())]
        (work / f"connector-{name}.properties").write_text("\n".join(lines) + "\n")
    (work / "log4j2.properties").write_text(jvm.log4j2(work / "connect.log", ("io.debezium",)))


def _names(work: Path) -> list[str]:
    return [_properties(p)["name"] for p in sorted(work.glob("connector-*.properties"))]


def _properties(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def _java(work: Path) -> list[str]:
    return jvm.command("kafka-connect", HEAP, work / "log4j2.properties", "-Xms64m")


def stop_from_pid_file(pid_file: Path | str) -> bool:
    return processes.stop_from_pid_file(Path(pid_file), MARKER, timeout=30.0)

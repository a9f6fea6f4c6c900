"""Helpers shared by the integration tests: pipelines on a test broker, and the exactly-once check."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import yaml
from deltalake import DeltaTable
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from offsetlake.config import load_pipeline
from offsetlake.kafka import KafkaCluster
from offsetlake.local import broker as embedded_broker
from offsetlake.ledger import pipeline_history, read_ledger
from offsetlake.metadata import HistoryEntry
from offsetlake.table import open_table, query

REPO = Path(__file__).resolve().parents[1]

JSON_SCHEMA = [
    {"name": "event_id", "type": "string", "required": True},
    {"name": "user_id", "type": "long", "required": True},
    {"name": "action", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "event_time", "type": "timestamp"},
    {"name": "seq", "type": "long"},
]


class RestartableBroker:
    """A broker of the test's own (the session's is shared), stopped and started again on the same
    port and data, by its PID."""

    def __init__(self, data_dir):
        self.data_dir = data_dir
        self.current = embedded_broker.start(data_dir)

    @property
    def bootstrap_servers(self) -> str:
        return self.current.bootstrap_servers

    def stop(self) -> None:
        embedded_broker.stop(self.current.pid)

    def start(self) -> None:
        self.current = embedded_broker.start(self.data_dir, port=self.current.port)

    def restart_in_background(self, down_seconds: float) -> threading.Thread:
        """Stop now; start again after `down_seconds`, in a thread (join it)."""
        self.stop()
        thread = threading.Thread(target=lambda: (time.sleep(down_seconds), self.start()))
        thread.start()
        return thread


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def write_pipeline(directory: Path, bootstrap: str, topics: list[str], lake: Path, name: str | None = None,
                   **overrides) -> str:
    """Write a pipeline YAML into `directory` and return its name."""
    name = name or unique("p")
    doc = {
        "name": name,
        "topics": topics,
        "kafka": {"bootstrap_servers": bootstrap, "timeout_seconds": 10},
        "table": {"path": str(lake / name)},
        "quarantine": {"path": str(lake / f"{name}_quarantine")},
        "format": {"type": "json", "schema": JSON_SCHEMA},
        "batch": {"max_records_per_batch": 100_000, "max_records_per_task": 50_000, "read_timeout_seconds": 20},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return name


def new_pipeline(bootstrap: str, pipelines_dir: Path, lake: Path, partitions: int = 3, records: int = 0,
                 **overrides):
    """A new topic, a pipeline reading it, and `records` committed records among aborted transactions."""
    from offsetlake.local.producer import produce
    topic = unique("t")
    create_topic(bootstrap, topic, partitions)
    name = write_pipeline(pipelines_dir, bootstrap, [topic], lake, **overrides)
    cfg = load(pipelines_dir, name)
    if records:
        produce(cfg.kafka, topic, records, transactional_share=0.6, abort_share=0.25, seed=len(name))
    return cfg, topic


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()


def kafka_committed_records(bootstrap: str, topic: str, until: dict[int, int] | None = None,
                            whole: bool = False) -> dict:
    """Every record Kafka returns under read_committed: {(topic, partition, offset): value}
    (`whole`: (key, value, headers)).

    Reads each partition from its log start up to `until[p]` (default: the LSO now).
    """
    cluster = KafkaCluster(_settings(bootstrap))
    tps = cluster.partitions([topic])
    ends = cluster.end_offsets(tps, "read_committed")
    starts = cluster.start_offsets(tps)
    out = {}
    for t, p in tps:
        end = ends[(t, p)] if until is None else until.get(p, 0)
        if end <= starts[(t, p)]:
            continue
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("truth"),
                             "isolation.level": "read_committed", "enable.auto.commit": False,
                             "enable.partition.eof": True, "auto.offset.reset": "error"})
        consumer.assign([TopicPartition(t, p, starts[(t, p)])])
        deadline = time.monotonic() + 60
        done = False
        while not done and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                if msg.error():
                    if msg.offset() >= end:
                        done = True
                    continue
                if msg.offset() >= end:
                    done = True
                    break
                out[(t, p, msg.offset())] = (msg.key(), msg.value(), msg.headers() or []) if whole else msg.value()
            if not done and consumer.position([TopicPartition(t, p)])[0].offset >= end:
                done = True
        consumer.close()
        assert done, f"could not read {t}[{p}] up to {end}"
    return out


def _settings(bootstrap: str):
    from offsetlake.config import KafkaSettings
    return KafkaSettings(bootstrap_servers=bootstrap, timeout_seconds=10)


def table_lineage(uri: str) -> list[tuple[str, int, int]]:
    rows = query(uri, "SELECT kafka_topic, kafka_partition, kafka_offset FROM t")
    return list(zip(rows.column(0).to_pylist(), rows.column(1).to_pylist(), rows.column(2).to_pylist()))


def quarantine_lineage(cfg) -> list[tuple[str, int, int]]:
    if not (Path(cfg.quarantine_path) / "_delta_log").is_dir():
        return []
    return table_lineage(cfg.quarantine_path)


def ledger_offsets(cfg) -> dict:
    tps = KafkaCluster(cfg.kafka).partitions(cfg.topics)
    return read_ledger(open_table(cfg.table_path), cfg.name, tps).offsets


def assert_exactly_once(cfg, caught_up: bool = True) -> int:
    """Row by row: every (topic, partition, offset) Kafka holds under read_committed below the
    ledger's committed end is in the table exactly once (or, if it did not parse, in the
    quarantine), and nothing else is. Returns the table's row count."""
    rows = table_lineage(cfg.table_path)
    counts = collections.Counter(rows)
    duplicated = sorted(k for k, n in counts.items() if n > 1)
    assert not duplicated, f"{len(duplicated)} duplicated rows, e.g. {duplicated[:5]}"
    offsets = ledger_offsets(cfg)
    expected = set()
    for topic in cfg.topics:
        until = {p: o for (t, p), o in offsets.items() if t == topic}
        expected |= set(kafka_committed_records(cfg.kafka.bootstrap_servers, topic, until))
        if caught_up:
            lso = KafkaCluster(cfg.kafka).end_offsets(KafkaCluster(cfg.kafka).partitions([topic]), "read_committed")
            behind = {tp: (offsets.get(tp), end) for tp, end in lso.items() if offsets.get(tp, 0) != end}
            assert not behind, f"ledger is not at the LSO: {behind}"
    quarantined = set(quarantine_lineage(cfg))
    assert not quarantined & set(counts), "records both in the table and in the quarantine"
    missing = sorted(expected - set(counts) - quarantined)
    unexpected = sorted(set(counts) - expected)
    assert not missing, f"{len(missing)} records missing from the table, e.g. {missing[:5]}"
    assert not unexpected, f"{len(unexpected)} rows that Kafka does not hold (aborted?), e.g. {unexpected[:5]}"
    return len(rows)


def assert_rows_are_kafkas_except(cfg, topic: str, partition: int, skipped: range) -> None:
    """After a reset that skipped `skipped` on one partition: the table holds every record Kafka returns
    under read_committed but those, each once and each with its own record's event_id (JSON events)."""
    kafka = kafka_committed_records(cfg.kafka.bootstrap_servers, topic)
    expected = {k: json.loads(v)["event_id"] for k, v in kafka.items() if not (k[1] == partition and k[2] in skipped)}
    rows = query(cfg.table_path, "SELECT kafka_topic, kafka_partition, kafka_offset, event_id FROM t").to_pylist()
    table = {(r["kafka_topic"], r["kafka_partition"], r["kafka_offset"]): r["event_id"] for r in rows}
    assert len(table) == len(rows), f"{len(rows) - len(table)} duplicated rows"
    missing, unexpected = sorted(expected.keys() - table.keys()), sorted(table.keys() - expected.keys())
    assert not missing and not unexpected, f"missing {missing[:5]}, unexpected (skipped?) {unexpected[:5]}"
    wrong = sorted(k for k, event_id in expected.items() if table[k] != event_id)
    assert not wrong, f"rows whose event_id is not their record's: {wrong[:5]}"


def run_cli(*args, env: dict | None = None, timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "OFFSETLAKE_HOME": str(REPO), "SPARK_LOCAL_IP": "127.0.0.1", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "offsetlake.cli", *args], env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"offsetlake {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc


def spark_submit(application: Path, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    """`spark-submit` of this Python's pyspark on local[2], bound to loopback, as the operator runs jobs."""
    env = {**os.environ, "OFFSETLAKE_HOME": str(REPO), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.run(
        [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.driver.host=127.0.0.1",
         str(application), *args],
        env=env, capture_output=True, text=True, timeout=timeout)


def files_containing(root: Path, needle: bytes) -> list[str]:
    """Every file under `root` whose bytes contain `needle` (a secret that must not be there)."""
    return [str(p) for p in Path(root).rglob("*") if p.is_file() and needle in p.read_bytes()]


def load(pipelines_dir: Path, name: str):
    return load_pipeline(name, pipelines_dir)


def assert_one_line_failure(proc, *fragments):
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("offsetlake: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def ingest_process(cfg, pipelines_dir: Path, env: dict | None = None) -> subprocess.Popen:
    full_env = {**os.environ, "OFFSETLAKE_HOME": str(REPO), "SPARK_LOCAL_IP": "127.0.0.1", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "offsetlake.cli", "ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir)],
        env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def wait_while_running(condition, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Wait until `condition()` holds; fail naming the process's last words if it exits first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[3:5]} exited early ({proc.returncode}): {proc.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {proc.args[3:5]}"
        time.sleep(0.5)


def data_files_on_disk(table_path: str) -> set[str]:
    root = Path(table_path)
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet") if "_delta_log" not in p.parts}


def pipeline_commits(cfg) -> list[HistoryEntry]:
    """The pipeline's commits, oldest first ([] before the table exists; any other error is raised)."""
    if not DeltaTable.is_deltatable(cfg.table_path):
        return []
    return pipeline_history(DeltaTable(cfg.table_path), cfg.name)


def assert_quarantine_accounts_for_the_rest(cfg):
    """table rows + quarantine rows = Kafka's read_committed records, each exactly once."""
    rows = table_lineage(cfg.table_path)
    bad = query(cfg.quarantine_path, "SELECT kafka_topic, kafka_partition, kafka_offset, value, error FROM t")
    bad_keys = list(zip(*(bad.column(i).to_pylist() for i in range(3))))
    assert len(set(bad_keys)) == len(bad_keys), "a record was quarantined twice"
    assert not set(bad_keys) & set(rows), "a record is both in the table and the quarantine"
    truth = kafka_committed_records(cfg.kafka.bootstrap_servers, cfg.topics[0])
    assert set(rows) | set(bad_keys) == set(truth)
    assert len(rows) + len(bad_keys) == len(truth)
    for key, value, error in zip(bad_keys, bad.column(3).to_pylist(), bad.column(4).to_pylist()):
        assert value == truth[key] and error  # raw bytes kept, with the reason
    return len(bad_keys)


def task_result(api, dag_id: str, run_id: str, task_id: str):
    """What an Airflow task returned (its XCom), through the REST API."""
    import urllib.parse
    run = urllib.parse.quote(run_id, safe="")
    value = api.get(f"/api/v2/dags/{dag_id}/dagRuns/{run}/taskInstances/{task_id}/xcomEntries/return_value")["value"]
    return json.loads(value) if isinstance(value, str) else value


class BackgroundSampler:
    """Calls `sample()` every `interval` seconds in a thread of its own while the `with` block runs
    (peak memory in the bench, secrets in process lists in tests/airflow/test_airflow_connections.py)."""

    interval = 0.1

    def __init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        raise NotImplementedError

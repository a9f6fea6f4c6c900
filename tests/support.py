"""Helpers shared by the integration tests: pipelines on a test broker, and the exactly-once check."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable

import oracle
from offsetlake.config import load_pipeline
from offsetlake.protocol.ledger import pipeline_history
from offsetlake.protocol.metadata import HistoryEntry
from offsetlake.storage.location import Location
from offsetlake.table import query
from offsetlake_local import broker as embedded_broker
from offsetlake_local import producer as demo_producer
from oracle import (  # noqa: F401 - the tests' oracle, re-exported
    JOURNAL,
    assert_exactly_once,
    kafka_offsets,
    kafka_partitions,
    ledger_offsets,
)

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
        self.current = embedded_broker.start(self.data_dir)

    def restart_in_background(self, down_seconds: float) -> threading.Thread:
        """Stop now; start again after `down_seconds`, in a thread (join it)."""
        self.stop()
        thread = threading.Thread(target=lambda: (time.sleep(down_seconds), self.start()))
        thread.start()
        return thread


def freeze(pid: int, timeout: float = 10.0) -> None:
    """Stop process `pid` (SIGSTOP) and return once every one of its threads has stopped: Linux wakes one thread
    to take the signal, which then stops the others, so on a loaded machine the rest may answer a request or
    two after kill() returns."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not all(_thread_state(pid, tid) in ("T", "t", None) for tid in os.listdir(f"/proc/{pid}/task")):
        assert time.monotonic() < deadline, f"process {pid} did not stop in {timeout:g} s"
        time.sleep(0.005)


def _thread_state(pid: int, tid: str) -> str | None:
    """A thread's state letter from /proc (None: the thread has ended)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def delta_spark_submit_args() -> str:
    """`PYSPARK_SUBMIT_ARGS` for an offsetlake job whose engine is delta-spark: its jars as `--jars` gives them."""
    from offsetlake_local.jars import delta_spark_jars_arg

    return f"{delta_spark_jars_arg()} pyspark-shell"


def write_pipeline(
    directory: Path, bootstrap: str, topics: list[str], lake: Path, name: str | None = None, **overrides
) -> str:
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


def write_per_topic_pipeline(directory: Path, bootstrap: str, prefix: str, lake: Path, **overrides) -> str:
    """A pipeline reading every topic named `<prefix>.…` (a pattern) into a table per topic, `lake/<last
    segment>` (and its quarantine beside it); `overrides` as `write_pipeline`'s. Returns its name."""
    return write_pipeline(
        directory,
        bootstrap,
        [f"^{re.escape(prefix)}\\."],
        lake,
        table={"path": str(lake / "{table}")},
        quarantine={"path": str(lake / "{table}_quarantine")},
        **overrides,
    )


def new_pipeline(bootstrap: str, pipelines_dir: Path, lake: Path, partitions: int = 3, records: int = 0, **overrides):
    """A new topic, a pipeline reading it, and `records` committed records among aborted transactions."""
    topic = unique("t")
    create_topic(bootstrap, topic, partitions)
    name = write_pipeline(pipelines_dir, bootstrap, [topic], lake, **overrides)
    cfg = load(pipelines_dir, name)
    if records:
        produce(cfg.kafka, topic, records, transactional_share=0.6, abort_share=0.25, seed=len(name))
    return cfg, topic


def produce(settings, topic: str, count: int, settle: bool = True, **options) -> demo_producer.ProduceReport:
    """offsetlake's demo producer, recording what it commits in the oracle's journal; returns once Kafka's LSO
    has passed what it wrote (`wait_for_markers`), unless `settle` is False: a test that holds a transaction
    open before these records, for the LSO to stay behind it."""
    report = demo_producer.produce(settings, topic, count, journal=JOURNAL, **options)
    if settle:
        wait_for_markers({"bootstrap.servers": settings.bootstrap_servers, **settings.client}, topic)
    return report


def wait_for_markers(client: dict, topic: str, timeout: float = 30) -> None:
    """Until each partition's LSO has reached its high watermark as it is now. The broker answers a
    transaction's commit (or abort) once it has logged its decision, and writes the markers that end it in the
    partitions after that: until then the LSO stops before the transaction, and a read_committed reader (an
    ingest's plan) would stop there too. A transaction another producer holds open before them keeps the LSO
    back for good: then this returns after `timeout`, as produce did before it waited."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(client)  # one for every question: a produce call is frequent in the tests
    partitions = kafka_partitions(client, topic, admin)
    high = kafka_offsets(client, topic, partitions, "high", admin)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stable = kafka_offsets(client, topic, partitions, "latest", admin)
        if all(stable[p] >= high[p] for p in partitions):
            return
        time.sleep(0.1)


class JournaledProducer:
    """A plain confluent-kafka producer whose records the oracle's journal knows (idempotent writes).
    `bad`: the reason the record must be quarantined with (a fragment of the quarantine's error)."""

    def __init__(self, bootstrap: str, **config):
        self._producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **config})

    def produce(
        self, topic: str, value=None, key=None, headers=None, partition: int | None = None, bad: str | None = None
    ) -> None:
        record = {"key": key, "value": value, **({"headers": headers} if headers else {})}
        placed = {} if partition is None else {"partition": partition}
        self._producer.produce(topic, **record, **placed, on_delivery=JOURNAL.sent(topic, record, None, bad))

    def flush(self, timeout: float = 10) -> None:
        assert self._producer.flush(timeout) == 0, "records still unsent"


def create_topic(bootstrap: str, topic: str, partitions: int, config: dict | None = None) -> None:
    """A topic with the broker's default replication factor (1 on one node, 3 on the cluster)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, config=config or {})])[topic].result()
    wait_for_leaders(bootstrap, topic, partitions)


def wait_for_leaders(bootstrap: str, topic: str, partitions: int, timeout: float = 30) -> None:
    """Until every partition of a new topic has a leader: Kafka creates a topic's partitions after it answers."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while True:
        meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        if meta and meta.error is None and len(meta.partitions) == partitions:
            if all(p.leader >= 0 for p in meta.partitions.values()):
                return
        assert time.monotonic() < deadline, f"topic {topic} has no leader for some partition after {timeout}s"
        time.sleep(0.1)


def kafka_committed_records(
    bootstrap: str, topic: str, until: dict[int, int] | None = None, whole: bool = False
) -> dict:
    """Every record Kafka returns under read_committed: {(topic, partition, offset): value}
    (`whole`: (key, value, headers)), from each partition's log start up to `until[p]` (default: the LSO)."""
    records = oracle.read_committed(bootstrap, topic, until)
    if whole:
        return {k: (r.key, r.value, r.headers) for k, r in records.items()}
    return {k: r.value for k, r in records.items()}


def kafka_settings(bootstrap: str):
    """A plain broker's settings, as a pipeline's `kafka` section holds them."""
    from offsetlake.config import KafkaSettings

    return KafkaSettings(bootstrap_servers=bootstrap, timeout_seconds=10)


def table_lineage(location: Location | str) -> list[tuple[str, int, int]]:
    """A table's (topic, partition, offset) rows; a path is a local table's."""
    location = location if isinstance(location, Location) else Location.of(location)
    rows = query(location, "SELECT kafka_topic, kafka_partition, kafka_offset FROM t")
    return list(zip(rows.column(0).to_pylist(), rows.column(1).to_pylist(), rows.column(2).to_pylist()))


def quarantine_lineage(cfg) -> list[tuple[str, int, int]]:
    location = cfg.quarantine_location
    if not DeltaTable.is_deltatable(location.uri, location.storage_options):
        return []
    return table_lineage(location)


def assert_rows_are_kafkas_except(cfg, topic: str, partition: int, skipped: range) -> None:
    """After a reset that skipped `skipped` on one partition: the oracle finds those records missing, and
    nothing else (every other record in the table or the quarantine once, with its values)."""
    found = oracle.check(cfg)
    kafka = oracle.read_committed(cfg.kafka.bootstrap_servers, topic)
    expected = sorted(k for k in kafka if k[1] == partition and k[2] in skipped)
    missing = sorted(w for w, _ in found.kinds.pop(oracle.MISSING, []))
    assert expected, f"nothing Kafka holds in {topic}[{partition}] {skipped}: the reset skipped nothing"
    assert missing == expected, f"missing {missing[:5]}..., the reset skipped {expected[:5]}..."
    assert found.ok, f"the oracle found, in {cfg.table_path}:\n{found.report()}"


def run_cli(*args, env: dict | None = None, timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "OFFSETLAKE_HOME": str(REPO), "SPARK_LOCAL_IP": "127.0.0.1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "offsetlake.cli", *args], env=full_env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"offsetlake {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc


def stream_process(cfg, pipelines_dir: Path, interval: float = 0.5, stderr: Path | None = None) -> subprocess.Popen:
    """`offsetlake stream` of a pipeline in a process of its own (SIGTERM stops it between batches). With
    `stderr`, what it says goes to that file, to be read while it runs."""
    env = {**os.environ, "OFFSETLAKE_HOME": str(REPO), "SPARK_LOCAL_IP": "127.0.0.1"}
    command = ["stream", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir), "--interval", str(interval)]
    return subprocess.Popen(
        [sys.executable, "-m", "offsetlake.cli", *command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if stderr is None else stderr.open("w"),
        text=True,
    )


def stop_stream(job: subprocess.Popen, timeout: float = 120, stderr: Path | None = None) -> tuple[str, str]:
    """SIGTERM a stream and collect what it said. One that has not stopped after `timeout` (it stops between
    batches) has its Python stacks printed (SIGUSR1, the CLI's faulthandler), is killed by PID, and fails
    the test with them: a stream that ignores SIGTERM is a defect, and must not outlive its test.
    `stderr`: the file its stderr went to, if not a pipe."""
    job.send_signal(signal.SIGTERM)
    try:
        out, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        job.send_signal(signal.SIGUSR1)
        time.sleep(2)
        job.kill()
        out, err = job.communicate()
        said = stderr.read_text(errors="replace") if stderr else err or ""
        raise AssertionError(f"the stream ignored SIGTERM for {timeout:.0f} s; its stacks: {said[-6000:]}") from None
    return out or "", (stderr.read_text(errors="replace") if stderr else err) or ""


def assert_lake_untouched(lake: Path) -> None:
    """Nothing written under the test's lake: no table, no quarantine, no stray file."""
    found = sorted(str(p.relative_to(lake)) for p in lake.rglob("*")) if lake.exists() else []
    assert not found, f"written under {lake}: {found[:5]}"


def table_rows(cfg) -> int:
    """Rows in the pipeline's table; 0 before a job has created it."""
    from offsetlake.errors import TableError

    try:
        return len(table_lineage(cfg.table_path))
    except TableError:
        return 0


def spark_submit(application: Path, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    """`spark-submit` of this Python's pyspark on local[2], bound to loopback, as the operator runs jobs."""
    env = {
        **os.environ,
        "OFFSETLAKE_HOME": str(REPO),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "spark-submit"),
            "--master",
            "local[2]",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.driver.bindAddress=127.0.0.1",
            "--conf",
            "spark.driver.host=127.0.0.1",
            str(application),
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


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


def assert_job_failed_in_one_line(proc, *fragments):
    """A job that started Spark (whose start-up notes go to stderr first) failed: its last line is
    offsetlake's one-line error holding `fragments`, and no traceback was printed."""
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("offsetlake: error: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in last, last


def ingest_process(cfg, pipelines_dir: Path, env: dict | None = None) -> subprocess.Popen:
    full_env = {**os.environ, "OFFSETLAKE_HOME": str(REPO), "SPARK_LOCAL_IP": "127.0.0.1", **(env or {})}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "offsetlake.cli",
            "ingest",
            "--pipeline",
            cfg.name,
            "--pipelines-dir",
            str(pipelines_dir),
        ],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_fault(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Wait until a job paused at a fault point says so (its `<point>.reached` file); fail if it exits first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(
                f"job exited ({proc.returncode}) before reaching {path.name}: {proc.stderr.read()[-2000:]}"
            )
        assert time.monotonic() < deadline, f"job never reached {path.name}"
        time.sleep(0.2)


def wait_while_running(condition, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Wait until `condition()` holds; fail naming the process's last words if it exits first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            said = proc.stderr.read()[-3000:] if proc.stderr else "(its stderr went to a file)"
            raise AssertionError(f"{proc.args[3:5]} exited early ({proc.returncode}): {said}")
        assert time.monotonic() < deadline, f"timed out waiting for {proc.args[3:5]}"
        time.sleep(0.5)


def data_files_on_disk(table_path: str) -> set[str]:
    root = Path(table_path)
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet") if "_delta_log" not in p.parts}


def pipeline_commits(cfg) -> list[HistoryEntry]:
    """The pipeline's commits, oldest first ([] before the table exists; any other error is raised)."""
    location = cfg.table_location
    if not DeltaTable.is_deltatable(location.uri, location.storage_options):
        return []
    return pipeline_history(location, location.delta_table(), cfg.name)


def assert_quarantine_accounts_for_the_rest(cfg) -> int:
    """The oracle's whole check, and the number of records quarantined."""
    assert_exactly_once(cfg)
    return len(quarantine_lineage(cfg))


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

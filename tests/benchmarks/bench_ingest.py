"""`make bench`: offsetlake ingest throughput next to the raw Kafka read rate, measured in one run.

Not collected by pytest. Prints a table, then every target with `met` or `NOT met`, and writes
tests/benchmarks/results.json. Rates are compared as ratios within the run because this machine
is shared: each format's ingest against Apache Kafka's own consumer benchmark on the same topic
(FORMAT_TARGETS: raw >= 100%, json and avro >= 90%, protobuf >= 80%), a session's first ingest within
+15% of a warm one, the driver's peak memory during 1M-record ingests <= 300 MB and each process's
peak at --scale-records within 1.2x of its peak at --records.

  raw read            one confluent-kafka consumer, read_committed, the whole topic: an anchor
                      (this and the raw, json and avro ingests: medians of 3 runs, each to a new table)
  perf-test           Apache Kafka's own kafka-consumer-perf-test (one JVM consumer, every partition,
                      read_committed) on each format's topic, median of 3: the anchor of the format
                      targets (with --client-config, which it is not given, the raw read of each topic instead)
  Spark peer          Spark's own Kafka source writing Delta with delta-spark (peer.py), raw, json
                      (from_json) and avro (from_avro), warm and the first batch of its session, in a
                      process of its own: offsetlake's rate over the peer's, reported (no target)
  first ingest        the raw ingest right after a session starts, in a process of its own (a new JVM, as
                      each spark-submit has): it also starts Spark's Python daemon and workers (forked
                      from the prewarmed process, offsetlake/spark/prewarm.py). Then three warm
                      ingests in the same process; the target is the median over 5 such processes of
                      first over the median of their warm ones. Each ingest to a new table, each from
                      a settled broker (below); session start reported apart, and the same 5 processes
                      again without the prewarmed daemon (session start + first ingest, each way)
  ingest raw / json   offsetlake ingest from an empty table to fully committed (session start apart),
                      each right after a raw read of its own: the share is the median of the pairs'
                      (paired: a burst of the broker's own work slows both sides alike)
  ingest avro         the same events in Avro (Confluent wire format, schema from the embedded registry),
                      each ingest right after a raw read of the Avro topic, as json's after one of its
                      own: a 1M json ingest right after a raw read of its topic ran faster than one
                      without (measured on the earlier stand-in broker: 1.36-1.48 s against 2.15-2.33 s),
                      so unpaired, avro would lose to paired json by the order of the runs alone.
  ingest protobuf     the same events in Protobuf (Confluent framing, the schema registered by
                      confluent-kafka's ProtobufSerializer in the embedded registry), paired as avro
  exactly-once cost   the same batch committed by the protocol (ledger read, verdict, txn, no
                      rebase) against a plain Delta append of the same kind of files (bench only),
                      end to end and with the bookkeeping timed directly (end to end is noisy); the
                      protocol's rounds are batches of one pipeline, each into a new table: its first
                      batch alone pays the broker creating its consumer group, as a pipeline's does
  small batch         `ingest` of 1,000 new records in a warm session
  stream latency      a record's Kafka commit to its Delta commit, `stream` with a warm session
  one batch           a new process (as a spark-submit is) ingests the --records topic in one batch, raw:
                      its rate and peak memory (VmRSS sampled 4x a second) of the driver, the JVM and
                      the largest Spark Python worker; a process of its own, so that the driver's peak is
                      the ingest's and not what the bench's own reads left in its heap
  scale               the same for --scale-records (default 10M) in one batch
  fetch size          the largest fetch response the broker sends when asked for at most 1 MiB
  airflow             through real Airflow processes (api-server, scheduler, dag-processor,
                      triggerer; LocalExecutor): an ingest run with nothing to do, trigger to end
                      of run; a triggered small batch (1,000 records), trigger to Delta commit; a
                      triggered batch of --records, trigger to Delta commit, step by step (Airflow's
                      task start, the processes' starts from /proc, the start-up line the job prints)

Every timed read and ingest on the embedded Apache Kafka broker starts once the broker has settled (its
own CPU use, from /proc, below 5% of a core for half a second): a measure started while the broker still
works off the one before (log flushes, its JIT, a GC) would pay for it.

    python tests/benchmarks/bench_ingest.py [--records 1000000] [--scale-records 10000000] [--airflow-only]
                                            [--formats-only | --memory-only]
                                            [--bootstrap HOST:PORT [--registry URL] [--client-config FILE]]

Any broker: with --bootstrap the bench runs against a Kafka cluster you name instead of the embedded
Apache Kafka node (offsetlake_local.broker; its version is the kafka-broker POM's): `make bench
BENCH_ARGS="--bootstrap kafka-1:9092 --client-config client.properties"`. It creates its own topics,
named with a unique prefix (offsetlake-bench-<id>.), deletes them and its pipelines' consumer groups
afterwards, and touches nothing else; it prints the broker's version. --client-config is a librdkafka
properties file (key=value lines: security.protocol, sasl.*, ssl.*) applied to every client the bench and
offsetlake create; --registry names a Confluent-compatible Schema Registry for the Avro line (default: the
embedded one, on this machine). The raw read reads all partitions with one consumer, with the reader's
fetch sizes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from offsetlake import batch as batch_module
from offsetlake.batch import ingest
from offsetlake.config import RESERVED_CLIENT_KEYS, parse_pipeline
from offsetlake.engine import DeltaRs
from offsetlake.formats.columns import table_schema
from offsetlake.kafka import KafkaCluster
from offsetlake.protocol.commit import add_actions
from offsetlake.protocol.metadata import HistoryEntry
from offsetlake.protocol.planning import split_ranges
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.read import reader as reader_module
from offsetlake.read.tasks import TaskContext
from offsetlake.read_job import run_tasks
from offsetlake.spark import prewarm as prewarm_module
from offsetlake.spark.session import build_session
from offsetlake.streaming import stream
from offsetlake.table import open_table
from offsetlake_local import broker

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from support import BackgroundSampler  # noqa: E402 - tests/ is not a package

sys.path.insert(0, str(Path(__file__).parent))
import peer  # noqa: E402 - this directory is not a package either

RESULTS = Path(__file__).with_name("results.json")
RUNS = 3  # the raw read, perf-test and the raw, json, avro and protobuf ingests are medians of this many runs
ONE_BATCH = 1 << 40  # max_records_per_batch of the memory processes: the whole topic in one batch
FIRST_RUNS = 5  # first ingests of a session, each in a process of its own: first/warm varies most
WARM_RUNS = 3  # warm ingests after each first one: its warm time is their median (one alone varies by 30%)
FORMAT_ROWS = {
    "raw": f"offsetlake ingest, raw format (median of {RUNS}, paired)",
    "json": f"offsetlake ingest, json format (median of {RUNS}, paired)",
    "avro": f"ingest, avro format, registry (median of {RUNS}, paired)",
    "protobuf": f"ingest, protobuf format, registry (median of {RUNS}, paired)",
}
LABEL_WIDTH = 54  # the longest measure's name, with a paired share
ACTIONS = ("view", "click", "add_to_cart", "purchase", "refund")
# The broker under test: the embedded Apache Kafka node unless --bootstrap names another. Set once in main (and in
# the first-ingest child, from the environment): every client the bench and offsetlake create uses them.
CLIENT: dict[str, str] = {}  # --client-config: librdkafka settings (security) for every client
PREFIX = "bench."  # topic names; --bootstrap: a unique prefix, and the topics are deleted afterwards
EXTERNAL = False  # --bootstrap given: a cluster of yours, shared with others (its topics are deleted after)
CREATED_TOPICS: list[str] = []
REGISTERED: list[tuple[str, str]] = []  # (registry URL, subject): deleted with the topics on your cluster
PIPELINES: set[str] = set()  # their consumer groups (offsetlake.<name>) are deleted with the topics
CLIENT_CONFIG_ENV = "OFFSETLAKE_BENCH_CLIENT_CONFIG"
BROKER_PID_ENV = "OFFSETLAKE_BENCH_BROKER_PID"  # the embedded broker, for `settled` in the first-ingest children
SETTLE_CPU = 0.05  # the broker is settled when it used less than this share of a core over SETTLE_WINDOW
SETTLE_WINDOW = 0.5
SETTLE_MAX_SECONDS = 20


def settled() -> float:
    """Wait until the embedded broker has finished the work a previous read left it (returns the
    seconds waited; no wait on a broker of yours, whose work the bench cannot see). A measure started
    while the broker still works off the one before shares the machine with it (on the earlier stand-in
    broker an ingest right after another took 1.8-2.2 s, the same after 4 s idle 1.3-1.6 s). Every timed read and ingest
    starts from a settled broker, so none pays for the one before (and a first ingest of a session is
    compared with a warm one on equal terms)."""
    pid = os.environ.get(BROKER_PID_ENV)
    if not pid:
        return 0.0
    started = time.perf_counter()
    tick = os.sysconf("SC_CLK_TCK")

    def cpu_seconds() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    while time.perf_counter() - started < SETTLE_MAX_SECONDS:
        before = cpu_seconds()
        time.sleep(SETTLE_WINDOW)
        if cpu_seconds() - before < SETTLE_CPU * SETTLE_WINDOW:
            break
    return time.perf_counter() - started


def kafka_conf(bootstrap: str, **extra) -> dict:
    """librdkafka settings of a bench client: the broker, --client-config, then the client's own."""
    return {"bootstrap.servers": bootstrap, **CLIENT, **extra}


def topic_name(name: str) -> str:
    return PREFIX + name


def read_client_config(path: str) -> dict[str, str]:
    """A librdkafka properties file: key=value lines, # or ! comments. One-line errors name the line."""
    settings: dict[str, str] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            sys.exit(f"bench: {path}:{number}: expected key=value")
        if key.strip() in RESERVED_CLIENT_KEYS:
            sys.exit(f"bench: {path}:{number}: {key.strip()!r} is set by the bench and offsetlake, not the file")
        settings[key.strip()] = value.strip()
    return settings


def use_broker(client_config: str | None, external: bool) -> None:
    global CLIENT, PREFIX, EXTERNAL
    EXTERNAL = external
    if client_config:
        CLIENT = read_client_config(client_config)
        os.environ[CLIENT_CONFIG_ENV] = str(Path(client_config).resolve())  # for the first-ingest children
    if external:
        PREFIX = f"offsetlake-bench-{uuid.uuid4().hex[:8]}."


def create_topic(bootstrap: str, topic: str, partitions: int = 4) -> None:
    """A topic of this run, with the broker's default replication factor; on a cluster of yours it is
    deleted at the end (`drop_created`)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(kafka_conf(bootstrap))
    admin.create_topics([NewTopic(topic, partitions)])[topic].result()
    CREATED_TOPICS.append(topic)


def drop_created(bootstrap: str, subjects: bool) -> None:
    """Delete the topics and consumer groups this run created (and its registry subjects, with
    `subjects`: the registry is yours), and nothing else."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(kafka_conf(bootstrap))
    for topic, future in admin.delete_topics(CREATED_TOPICS, operation_timeout=30).items() if CREATED_TOPICS else []:
        try:
            future.result()
        except Exception as err:  # noqa: BLE001 - report and go on: the rest still gets deleted
            print(f"bench: could not delete topic {topic}: {err}")
    groups = [f"offsetlake.{name}" for name in sorted(PIPELINES)] + ["bench-raw", "bench-probe"]
    for _group, future in admin.delete_consumer_groups(groups, request_timeout=30).items():
        try:
            future.result()
        except Exception:  # noqa: BLE001 - a group that was never created: nothing to delete
            pass
    from confluent_kafka.schema_registry import SchemaRegistryClient

    for url, subject in REGISTERED if subjects else []:
        try:
            client = SchemaRegistryClient({"url": url})
            client.delete_subject(subject)
            client.delete_subject(subject, permanent=True)
        except Exception as err:  # noqa: BLE001 - report and go on
            print(f"bench: could not delete subject {subject}: {err}")
    print(
        f"bench: deleted {len(CREATED_TOPICS)} topics ({PREFIX}*), "
        f"{len(REGISTERED) if subjects else 0} registry subjects and this run's consumer groups"
    )


def describe_broker(bootstrap: str) -> str:
    """What the broker says of itself to a client: its nodes, the inter-broker protocol version where it
    reports one (Apache Kafka before 4.0), and its highest API versions (Fetch's rises with each release)."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logger = logging.getLogger(f"bench.broker.{uuid.uuid4().hex[:6]}")
    logger.addHandler(Lines())
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    admin = AdminClient(kafka_conf(bootstrap, debug="feature", logger=logger))
    metadata = admin.list_topics(timeout=30)
    protocol = None
    try:
        node = str(min(metadata.brokers))
        found = admin.describe_configs([ConfigResource(ResourceType.BROKER, node)])
        configs = next(iter(found.values())).result(timeout=30)
        protocol = getattr(configs.get("inter.broker.protocol.version"), "value", None)
    except Exception:  # noqa: BLE001 - not every broker answers DescribeConfigs for itself
        pass
    admin.poll(0.5)
    apis = dict(re.findall(r"ApiKey (\w+) \(\d+\) Versions \d+\.\.(\d+)", "\n".join(lines)))
    wanted = ", ".join(f"{k} v{apis[k]}" for k in ("Fetch", "Produce", "ListOffsets") if k in apis)
    return (
        f"{bootstrap}: {len(metadata.brokers)} broker(s), cluster id {metadata.cluster_id}; "
        f"inter.broker.protocol.version {protocol or 'not reported'}; highest API versions {wanted or 'unknown'} "
        f"({len(apis)} APIs)"
    )


def produce(bootstrap: str, topic: str, count: int, start: int = 0) -> float:
    """~110-byte JSON events through an idempotent producer. Returns seconds."""
    rng = random.Random(1 + start)
    values = (
        f'{{"event_id":"e{i:012d}","user_id":{rng.randrange(5000)},"action":"{rng.choice(ACTIONS)}",'
        f'"amount":{rng.uniform(0, 500):.2f},"event_time":"2026-11-22T10:00:00.000Z","seq":{i}}}'.encode()
        for i in range(start, start + count)
    )
    return send_all(bootstrap, topic, values, start)


def send_all(bootstrap: str, topic: str, values, start: int = 0) -> float:
    """Write `values` round-robin over 4 partitions through an idempotent producer. Returns seconds."""
    producer = Producer(
        kafka_conf(
            bootstrap,
            **{
                "enable.idempotence": True,
                "linger.ms": 20,
                "batch.num.messages": 10000,
                "queue.buffering.max.messages": 1_000_000,
            },
        )
    )
    started = time.perf_counter()
    for i, value in enumerate(values, start):
        while True:
            try:
                producer.produce(topic, value=value, partition=i % 4)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    return time.perf_counter() - started


BENCH_AVRO = {
    "type": "record",
    "name": "BenchEvent",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "user_id", "type": "long"},
        {"name": "action", "type": "string"},
        {"name": "amount", "type": ["null", "double"]},
        {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "seq", "type": "long"},
    ],
}


def produce_avro(bootstrap: str, topic: str, count: int, registry_url: str) -> float:
    """The same events as `produce`, in Avro with the Confluent framing (schema registered once)."""
    import io
    import struct

    import fastavro
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    schema_id = SchemaRegistryClient({"url": registry_url}).register_schema(
        f"{topic}-value", Schema(json.dumps(BENCH_AVRO), "AVRO")
    )
    REGISTERED.append((registry_url, f"{topic}-value"))
    parsed, frame = fastavro.parse_schema(BENCH_AVRO), b"\x00" + struct.pack(">I", schema_id)
    rng = random.Random(1)

    def value(i: int) -> bytes:
        body = io.BytesIO()
        body.write(frame)
        fastavro.schemaless_writer(
            body,
            parsed,
            {
                "event_id": f"e{i:012d}",
                "user_id": rng.randrange(5000),
                "action": rng.choice(ACTIONS),
                "amount": round(rng.uniform(0, 500), 2),
                "event_time": 1_795_000_000_000,
                "seq": i,
            },
        )
        return body.getvalue()

    return send_all(bootstrap, topic, (value(i) for i in range(count)))


def avro_events(bootstrap: str, registry_url: str, lake: Path, records: int) -> dict:
    """The bench events in Avro on topic <prefix>avro; returns the pipeline format that reads them."""
    fmt = {"type": "avro", "registry": {"url": registry_url}}
    create_topic(bootstrap, topic_name("avro"))
    produce_avro(bootstrap, topic_name("avro"), records, registry_url)
    return fmt


def bench_event_message():
    """The bench events as a Protobuf message built at run time (no protoc here): BenchEvent's fields, the
    time a google.protobuf.Timestamp, as a Protobuf producer would send it."""
    from google.protobuf import descriptor_pb2, descriptor_pool, timestamp_pb2
    from google.protobuf.message_factory import GetMessageClass

    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="offsetlake_bench/event.proto",
        package="offsetlake.bench",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )
    event = file.message_type.add(name="BenchEvent")
    for number, (name, kind) in enumerate(
        (
            ("event_id", F.TYPE_STRING),
            ("user_id", F.TYPE_INT64),
            ("action", F.TYPE_STRING),
            ("amount", F.TYPE_DOUBLE),
            ("event_time", F.TYPE_MESSAGE),
            ("seq", F.TYPE_INT64),
        ),
        start=1,
    ):
        type_name = ".google.protobuf.Timestamp" if kind == F.TYPE_MESSAGE else None
        event.field.add(name=name, number=number, type=kind, label=F.LABEL_OPTIONAL, type_name=type_name)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return GetMessageClass(pool.FindMessageTypeByName("offsetlake.bench.BenchEvent"))


def produce_protobuf(bootstrap: str, topic: str, count: int, registry_url: str) -> float:
    """The same events as `produce`, in Protobuf with the Confluent framing: the first serialized by
    confluent-kafka's ProtobufSerializer (which registers the schema), the rest given its frame."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    event_type = bench_event_message()
    serialize = ProtobufSerializer(
        event_type, SchemaRegistryClient({"url": registry_url}), {"use.deprecated.format": False}
    )
    REGISTERED.append((registry_url, f"{topic}-value"))
    rng = random.Random(1)

    def event(i: int):
        message = event_type(
            event_id=f"e{i:012d}",
            user_id=rng.randrange(5000),
            action=rng.choice(ACTIONS),
            amount=round(rng.uniform(0, 500), 2),
            seq=i,
        )
        message.event_time.FromMilliseconds(1_795_000_000_000)
        return message

    first = event(0)
    framed = serialize(first, SerializationContext(topic, MessageField.VALUE))
    frame = framed[: len(framed) - len(first.SerializeToString())]

    def values():
        yield framed
        for i in range(1, count):
            yield frame + event(i).SerializeToString()

    return send_all(bootstrap, topic, values())


def protobuf_events(bootstrap: str, registry_url: str, records: int) -> dict:
    """The bench events in Protobuf on topic <prefix>protobuf; returns the pipeline format that reads them."""
    create_topic(bootstrap, topic_name("protobuf"))
    produce_protobuf(bootstrap, topic_name("protobuf"), records, registry_url)
    return {"type": "protobuf", "registry": {"url": registry_url}}


@contextlib.contextmanager
def broker_under_test(args, work: Path):
    """(bootstrap, registry URL, what the broker says of itself): the embedded Apache Kafka node, or the cluster
    --bootstrap names; --registry or the embedded registry. On your cluster, deletes what the run made."""
    from offsetlake_local import schema_registry

    use_broker(args.client_config, external=bool(args.bootstrap))
    registry = None if args.registry else schema_registry.start(work / "registry")
    embedded = None if args.bootstrap else broker.start(work / "broker")
    bootstrap = args.bootstrap or embedded.bootstrap_servers
    if embedded:
        os.environ[BROKER_PID_ENV] = str(embedded.pid)  # inherited by the first-ingest children
    try:
        described = describe_broker(bootstrap) + (" (the embedded Apache Kafka node)" if embedded else "")
        print(f"broker: {described}")
        yield bootstrap, args.registry or registry.url, described
    finally:
        try:
            if EXTERNAL or args.registry:  # what the run made on your cluster or registry
                drop_created(bootstrap, subjects=bool(args.registry))
        finally:
            if registry:
                schema_registry.stop(registry.pid)
            if embedded:
                broker.stop(embedded.pid)


def formats_only(args, work: Path) -> None:
    """Raw read, then raw, json, avro and protobuf ingests of the same events in one session, each format's
    rate against Kafka's own consumer benchmark on its topic."""
    records, lake, events = args.records, work / "lake", topic_name("events")
    with broker_under_test(args, work) as (bootstrap, registry_url, _):
        create_topic(bootstrap, events)
        produce(bootstrap, events, records)
        topics = {"raw": events, "json": events, "avro": topic_name("avro"), "protobuf": topic_name("protobuf")}
        formats = {
            "raw": {"type": "raw"},
            "json": JSON_FORMAT,
            "avro": avro_events(bootstrap, registry_url, lake, records),
            "protobuf": protobuf_events(bootstrap, registry_url, records),
        }
        cluster = KafkaCluster(pipeline("bench_json", bootstrap, events, lake, JSON_FORMAT).kafka)
        n_raw, raw_s = median_raw_read(bootstrap, events, committed_ends(cluster, events))
        spark = build_session("offsetlake-bench")
        n_first, first_s = timed_ingest(spark, pipeline("bench_warm", bootstrap, events, lake, {"type": "raw"}))
        measured = {
            kind: median_ingest(
                spark, bootstrap, topics[kind], lake, f"bench_{kind}", fmt, committed_ends(cluster, topics[kind])
            )
            for kind, fmt in formats.items()
        }
        spark.stop()
        found = peers(bootstrap, topics, n_raw, work)
        anchors, anchor = format_anchors(found, bootstrap, topics, cluster)
    rates = {kind: n / seconds for kind, (n, seconds, _) in measured.items()}
    for kind, (n, seconds, share) in measured.items():
        print_row(FORMAT_ROWS[kind], n, seconds, rates[kind], share)
    print_peers(found, {"first": n_first / first_s, **rates}, n_raw / raw_s)
    print_targets(format_targets(rates, anchors, anchor))


def memory_only(args, work: Path) -> None:
    """The one-batch memory lines alone: a --records batch and a --scale-records batch, each in a new
    process, raw, and the memory targets."""
    lake, memory = work / "lake", {}
    with broker_under_test(args, work) as (bootstrap, _, _):
        for records, name in ((args.records, "memory"), (args.scale_records, "scale")):
            if records:
                create_topic(bootstrap, topic_name(name))
                produce(bootstrap, topic_name(name), records)
                memory[records] = memory_ingest(bootstrap, topic_name(name), lake, f"bench_{name}")
    for records, found in memory.items():
        rate = found["records"] / found["seconds"]
        print(f"one {records:,}-record batch, raw, in a new process: {rate:,.0f} rec/s; peak MB {found['peak_mb']}")
    scale = memory.get(args.scale_records, {}).get("peak_mb")
    print_targets(memory_targets(args.records, memory[args.records]["peak_mb"], args.scale_records, scale))


def print_row(name: str, records: int, seconds: float, rate: float, ratio: float | None) -> None:
    """One line of the measure table: the header's columns in `main`."""
    share = "" if ratio is None else f"{ratio:.1%}"
    print(f"{name:<{LABEL_WIDTH}} {records:>9} {seconds:>8.2f} {rate:>10.0f} {share:>12}")


# Each format's ingest against Apache Kafka's own consumer benchmark reading the same topic from the same broker:
# what a format costs on top of reading is what stands between offsetlake and the broker's speed.
FORMAT_TARGETS = {"raw": 1.00, "json": 0.90, "avro": 0.90, "protobuf": 0.80}
FIRST_OVER_WARM = 1.15  # a session's first ingest over a warm one
DRIVER_PEAK_MB = 300  # the driver's peak during --records ingests
SCALE_PEAK_GROWTH = 1.2  # each process's peak at --scale-records over its peak at --records


def format_targets(rates: dict[str, float], anchors: dict[str, float], anchor: str) -> list[tuple[str, str, bool]]:
    where = "on your cluster" if EXTERNAL else "on the embedded Apache Kafka"
    return [
        (
            f"{kind} ingest {rates[kind] / anchors[kind]:.1%} of {anchor}",
            f">= {share:.0%} ({where})",
            rates[kind] >= share * anchors[kind],
        )
        for kind, share in FORMAT_TARGETS.items()
        if kind in rates
    ]


def format_anchors(found: dict | None, bootstrap: str, topics: dict[str, str], cluster: KafkaCluster):
    """({format: records a second}, what they are): kafka-consumer-perf-test's fetch rate on each format's
    topic; without it (--client-config), the confluent-kafka raw read of each topic."""
    if found is not None:
        return {kind: run["fetch_rate"] for kind, run in found["perf_test"].items()}, "kafka-consumer-perf-test"
    rates = {}
    for topic in dict.fromkeys(topics.values()):
        n, seconds = raw_read(bootstrap, topic, committed_ends(cluster, topic))
        rates[topic] = n / seconds
    return {kind: rates[topic] for kind, topic in topics.items()}, "the raw read (confluent-kafka) of its topic"


def memory_targets(records: int, peaks: dict[str, float], scale_records: int, scale_peaks: dict | None):
    driver = peaks["driver (python)"]
    targets = [
        (
            f"driver peak {driver:.0f} MB during {records:,}-record ingests",
            f"<= {DRIVER_PEAK_MB} MB",
            driver <= DRIVER_PEAK_MB,
        )
    ]
    for role, peak in peaks.items() if scale_peaks else ():
        targets.append(
            (
                f"{role} peak {scale_peaks[role]:.0f} MB at {scale_records:,} records, {peak:.0f} MB at {records:,}",
                f"<= {SCALE_PEAK_GROWTH}x",
                scale_peaks[role] <= SCALE_PEAK_GROWTH * peak,
            )
        )
    return targets


def peers(bootstrap: str, topics: dict[str, str], records: int, work: Path) -> dict | None:
    """Apache Kafka's own consumer benchmark on each format's topic (`topics`: {format: topic}) and the Spark
    peer (Spark's Kafka source writing with delta-spark) on raw, json and avro; None on a cluster that needs
    client settings (the peers take librdkafka's none)."""
    if CLIENT:
        print("peers: skipped (--client-config: Spark's and Kafka's Java clients are not given librdkafka's settings)")
        return None
    by_topic = {}
    for topic in dict.fromkeys(topics.values()):
        runs = []
        for _ in range(RUNS):  # the anchor a median of RUNS too, as each ingest it is set against
            settled()
            runs.append(peer.kafka_perf_test(bootstrap, topic, records))
        by_topic[topic] = sorted(runs, key=lambda run: run["fetch_rate"])[len(runs) // 2]
    settled()
    spark_topics = {kind: topics[kind] for kind in ("raw", "json", "avro")}
    spark_peer = peer.spark_peer(bootstrap, spark_topics, BENCH_AVRO, work / "peer")
    return {"perf_test": {kind: by_topic[topic] for kind, topic in topics.items()}, "spark": spark_peer}


def print_peers(found: dict | None, ours: dict[str, float], anchor_rate: float) -> None:
    """Prints the anchors and the Spark peer beside offsetlake. `ours`: offsetlake's rate by kind ("first",
    "raw", "json", "avro", "protobuf"); `anchor_rate`: the confluent-kafka raw read's."""
    if found is None:
        return
    perf, spark_peer = found["perf_test"]["raw"], found["spark"]
    print(
        f"\nanchors, one consumer reading every partition under read_committed: kafka-consumer-perf-test (Apache "
        f"Kafka's own, JVM; median of {RUNS}) {perf['fetch_rate']:,.0f} rec/s fetching "
        f"({perf['rate']:,.0f} with its group join); "
        f"confluent-kafka loop {anchor_rate:,.0f} rec/s; on the avro topic "
        f"{found['perf_test']['avro']['fetch_rate']:,.0f}, on the protobuf topic "
        f"{found['perf_test']['protobuf']['fetch_rate']:,.0f} rec/s"
    )
    print(
        f"peer: Spark's Kafka source (spark-sql-kafka-0-10) writing Delta with delta-spark, local[2], availableNow, "
        f"read_committed; session start {spark_peer['session_seconds']:.1f}s (apart)"
    )
    print(f"{'peer measure':<{LABEL_WIDTH}} {'records':>9} {'seconds':>8} {'rec/s':>10} {'offsetlake/':>12}")
    for kind, label in (
        ("first", "peer first batch of a session, raw"),
        ("raw", f"peer raw (median of {peer.RUNS})"),
        ("json", f"peer json, from_json (median of {peer.RUNS})"),
        ("avro", f"peer avro, from_avro (median of {peer.RUNS})"),
    ):
        run = spark_peer[kind]
        rate = run["records"] / run["seconds"]
        ratio = ours[kind] / rate
        print(f"{label:<{LABEL_WIDTH}} {run['records']:>9} {run['seconds']:>8.2f} {rate:>10.0f} {ratio:>11.1f}x")


def print_targets(targets: list[tuple[str, str, bool]]) -> None:
    """(what was measured, the target, whether it is met), one line each."""
    print("\ntargets:")
    for measured, target, met in targets:
        print(f"  {'met    ' if met else 'NOT met'}  {measured}  (target {target})")


def raw_read(bootstrap: str, topic: str, ends: dict) -> tuple[int, float]:
    """One confluent-kafka consumer, read_committed, the whole topic: the physical anchor.

    It reads all partitions at once, with the reader's fetch sizes: the fastest one consumer reads,
    so the shares are not flattered.
    """
    consumer = Consumer(
        kafka_conf(
            bootstrap,
            **{
                "group.id": "bench-raw",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "receive.message.max.bytes": reader_module.RECEIVE_BYTES,
                "fetch.max.bytes": reader_module.FETCH_BYTES,
                "max.partition.fetch.bytes": reader_module.FETCH_BYTES,
                "queued.max.messages.kbytes": reader_module.QUEUE_BYTES // 1024,
                "fetch.queue.backoff.ms": reader_module.FETCH_QUEUE_BACKOFF_MS,
            },
        )
    )
    todo = {tp: end for tp, end in sorted(ends.items()) if end > 0}
    rounds = [todo]
    n = 0
    settled()
    started = time.perf_counter()
    for partitions in rounds:
        left = dict(partitions)
        consumer.assign([TopicPartition(t, p, 0) for t, p in left])
        while left:
            for msg in consumer.consume(10000, 1.0):
                tp = (msg.topic(), msg.partition())
                if tp not in left:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        if msg.offset() >= left[tp]:
                            del left[tp]
                    else:
                        print(f"raw read: {msg.error().str()}")
                    continue
                n += 1
                if msg.offset() + 1 >= left[tp]:
                    del left[tp]
        consumer.unassign()
    elapsed = time.perf_counter() - started
    consumer.close()
    return n, elapsed


JSON_FORMAT = {
    "type": "json",
    "schema": [
        {"name": "event_id", "type": "string", "required": True},
        {"name": "user_id", "type": "long"},
        {"name": "action", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "event_time", "type": "timestamp"},
        {"name": "seq", "type": "long"},
    ],
}


def pipeline(
    name: str,
    bootstrap: str,
    topic: str,
    lake: Path,
    fmt: dict,
    batch_records: int = 1_000_000,
    table: str | None = None,
):
    """Pipeline `name` (consumer group offsetlake.<name>) over `topic` into lake/<table> (default: lake/<name>)."""
    PIPELINES.add(name)
    return parse_pipeline(
        {
            "name": name,
            "topics": [topic],
            "kafka": {"bootstrap_servers": bootstrap, "client": dict(CLIENT)},
            "table": {"path": str(lake / (table or name))},
            "format": fmt,
            "batch": {"max_records_per_batch": batch_records, "max_records_per_task": 250_000},
        },
        f"{name}.yaml",
    )


def largest_fetch_response(bootstrap: str, topic: str, partition: int, offset: int) -> int:
    """Bytes of the largest fetch response for a read from `offset`, asking for at most 1 MiB
    (fetch.max.bytes) and 64 KiB per partition: what bounds a reader's memory on this broker."""
    sizes: list[int] = []

    class Sizes(logging.Handler):
        def emit(self, record):
            found = re.search(r"Received FetchResponse \(v\d+, (\d+) bytes", record.getMessage())
            if found:
                sizes.append(int(found.group(1)))

    logger = logging.getLogger(f"bench.fetch.{uuid.uuid4().hex[:6]}")
    logger.addHandler(Sizes())
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    consumer = Consumer(
        kafka_conf(
            bootstrap,
            **{
                "group.id": "bench-probe",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.max.bytes": 1 << 20,
                "max.partition.fetch.bytes": 1 << 16,
                "receive.message.max.bytes": 1_000_000_000,
                "debug": "protocol",
            },
        ),
        logger=logger,
    )
    consumer.assign([TopicPartition(topic, partition, offset)])
    deadline = time.monotonic() + 60
    while not sizes and time.monotonic() < deadline:
        consumer.consume(1000, 0.5)
    consumer.close()
    return max(sizes, default=0)


def timed_ingest(spark, cfg) -> tuple[int, float]:
    settled()
    started = time.perf_counter()
    results = ingest(spark, cfg)
    return sum(r.records for r in results), time.perf_counter() - started


def committed_ends(cluster: KafkaCluster, topic: str) -> dict:
    """The topic's end offsets under read_committed: what a raw read paired with an ingest reads up to."""
    return cluster.end_offsets(cluster.partitions([topic]), "read_committed")


def median_ingest(
    spark, bootstrap: str, topic: str, lake: Path, name: str, fmt: dict, paired_with: dict | None = None
) -> tuple[int, float, float | None]:
    """The median of RUNS ingests of the same records, each into a table of its own (the first is
    `name`): one ingest's time here depends mostly on how busy the broker happens to be. Returns the
    median records and seconds, and with `paired_with` (the topic's end offsets) the median share:
    each ingest then runs right after a raw read of its own, and its share is its rate over that
    read's. The broker's own bursts of work (up to a CPU-second, seen while idle) slow both sides of
    a pair alike, where shares of medians taken minutes apart swung from 49% to 82% on the same code."""
    records, seconds, shares = [], [], []
    for i in range(RUNS):
        n_read, read_s = raw_read(bootstrap, topic, paired_with) if paired_with else (None, None)
        n, sec = timed_ingest(spark, pipeline(name if i == 0 else f"{name}_{i}", bootstrap, topic, lake, fmt))
        records.append(n)
        seconds.append(sec)
        if paired_with:
            shares.append((n / sec) / (n_read / read_s))
    return (statistics.median(records), statistics.median(seconds), statistics.median(shares) if shares else None)


def first_ingest(bootstrap: str, topic: str, lake: Path, name: str, prewarm: bool = True) -> dict:
    """A new process (its own JVM) starts a session, ingests the topic into a new table `name`, then again
    (warm) WARM_RUNS times into new tables. `prewarm=False`: its session starts without the prewarmed
    daemon (offsetlake/spark/prewarm.py), as Spark alone starts its Python daemon."""
    env = {**os.environ, prewarm_module.SWITCH_ENV: "1" if prewarm else "0"}
    return in_a_new_process("first-ingest", bootstrap, topic, lake, name, timeout=600, env=env)


def in_a_new_process(
    child: str, bootstrap: str, topic: str, lake: Path, name: str, timeout: float, env: dict | None = None
) -> dict:
    """This file run as `--<child> BOOTSTRAP TOPIC LAKE NAME` in a process of its own (its own JVM, as a
    spark-submit has): what it printed as its last line, JSON."""
    out = subprocess.run(
        [sys.executable, __file__, f"--{child}", bootstrap, topic, str(lake), name],
        check=True,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def first_ingest_here(bootstrap: str, topic: str, lake: Path, name: str) -> None:
    """The child of `first_ingest`: prints {records, session_seconds, seconds, warm_seconds} as its last line,
    warm_seconds the median of WARM_RUNS ingests after the first."""
    started = time.perf_counter()
    spark = build_session("offsetlake-bench-first")
    session_seconds = time.perf_counter() - started
    records, seconds = timed_ingest(spark, pipeline(name, bootstrap, topic, lake, {"type": "raw"}))
    warm_seconds = statistics.median(
        timed_ingest(spark, pipeline(f"{name}_warm{i}", bootstrap, topic, lake, {"type": "raw"}))[1]
        for i in range(WARM_RUNS)
    )
    spark.stop()
    print(
        json.dumps(
            {"records": records, "session_seconds": session_seconds, "seconds": seconds, "warm_seconds": warm_seconds}
        )
    )


def memory_ingest(bootstrap: str, topic: str, lake: Path, name: str) -> dict:
    """A new process, as a spark-submit is, starts a session and ingests the topic into a new table `name` in
    one batch: {records, seconds, peak_mb: {driver (python), jvm, python worker (largest)}}. A process of its
    own, so that the driver's peak is the ingest's, not what the bench's own reads left in its heap."""
    return in_a_new_process("memory-ingest", bootstrap, topic, lake, name, timeout=3600)


def memory_ingest_here(bootstrap: str, topic: str, lake: Path, name: str) -> None:
    """The child of `memory_ingest`: prints its result as its last line."""
    spark = build_session("offsetlake-bench-memory")
    cfg = pipeline(name, bootstrap, topic, lake, {"type": "raw"}, batch_records=ONE_BATCH)
    with PeakMemory() as peak:
        records, seconds = timed_ingest(spark, cfg)
    spark.stop()
    print(json.dumps({"records": records, "seconds": seconds, "peak_mb": peak.by_role()}))


def median_first_ingest(bootstrap: str, topic: str, lake: Path, prewarm: bool = True) -> dict:
    """Medians over FIRST_RUNS processes of: records, seconds of the first ingest, session start seconds, and
    first/warm (each process's first ingest over its own warm one)."""
    kind = "cold" if prewarm else "cold_unwarmed"
    runs = [first_ingest(bootstrap, topic, lake, f"bench_{kind}_{i}", prewarm) for i in range(FIRST_RUNS)]
    return {
        "records": statistics.median(r["records"] for r in runs),
        "seconds": statistics.median(r["seconds"] for r in runs),
        "session_seconds": statistics.median(r["session_seconds"] for r in runs),
        "over_warm": statistics.median(r["seconds"] / r["warm_seconds"] for r in runs),
        "runs": runs,
    }


def print_unwarmed(first: dict, unwarmed: dict) -> None:
    """The first batch of a session with the prewarmed daemon and without it (OFFSETLAKE_SPARK_PREWARM=0):
    the prewarmed process imports while the driver JVM starts, so part of what it saves the first batch
    it costs the session's start; the sum is what a spark-submit gains."""
    for label, m in (("with the prewarmed daemon", first), ("without it (OFFSETLAKE_SPARK_PREWARM=0)", unwarmed)):
        print(
            f"first batch of a session {label}: session start {m['session_seconds']:.2f}s + first 1M ingest "
            f"{m['seconds']:.2f}s = {m['session_seconds'] + m['seconds']:.2f}s; first/warm {m['over_warm'] - 1:+.0%} "
            f"(medians of {FIRST_RUNS} processes)"
        )


def median_raw_read(bootstrap: str, topic: str, ends: dict) -> tuple[int, float]:
    return _medians([raw_read(bootstrap, topic, ends) for _ in range(RUNS)])


def _medians(runs: list[tuple[int, float]]) -> tuple[int, float]:
    """(records, seconds) of several runs -> the median of each."""
    return statistics.median(n for n, _ in runs), statistics.median(sec for _, sec in runs)


def plain_append(spark, cfg) -> tuple[int, float, float]:
    """Bench only: the batch ingest would plan (one batch, same tasks, same files), committed as a
    plain Delta append: no ledger read, no verdict, no txn, no userMetadata, rebase allowed.
    Returns (records, seconds, seconds of the commit alone)."""
    started = time.perf_counter()
    cluster = KafkaCluster(cfg.kafka)
    tps = cluster.partitions(cfg.topics)
    ends = cluster.end_offsets(tps, "read_committed")
    schema = table_schema(cfg)
    table = open_table(cfg.table_location, schema, [], cfg.name)
    ranges = [OffsetRange(t, p, 0, end) for (t, p), end in ends.items() if end > 0]
    tasks = split_ranges(ranges, cfg.batch.max_records_per_task)
    data = run_tasks(spark, TaskContext(cfg, 1, uuid.uuid4().hex[:16], tuple(tasks), {"faults": {}})).data
    commit_started = time.perf_counter()
    table.create_write_transaction(add_actions([f for _, f in data]), mode="append", schema=schema)
    done = time.perf_counter()
    return sum(f.num_records for _, f in data), done - started, done - commit_started


@contextlib.contextmanager
def time_spent(owner, *names: str):
    """Seconds spent in `owner.<name>` for each name while the block runs (wrapped, then restored).
    A wrapped call made inside another (the ledger read inside `commit`) counts once, in the outer."""
    spent = dict.fromkeys(names, 0.0)
    originals = {name: getattr(owner, name) for name in names}
    depth = [0]

    def timed(name, fn):
        def call(*args, **kwargs):
            started = time.perf_counter()
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    spent[name] += time.perf_counter() - started

        return call

    for name in names:
        setattr(owner, name, timed(name, originals[name]))
    try:
        yield spent
    finally:
        for name, fn in originals.items():
            setattr(owner, name, fn)


def exactly_once_overhead(spark, make_cfg, rounds: int = 5) -> dict:
    """Alternate protocol ingest and plain append on fresh tables; compare the medians. One run to
    the next varies by 10-20% here, far more than the bookkeeping costs, so the bookkeeping is also
    timed directly: everything the protocol adds around the same Spark job (ledger reads, plan,
    verdict, the commit with txn actions, attempt clean-up, group offsets, the up-to-date check)
    against the plain commit alone. `make_cfg(name, table)`: the protocol's rounds are one pipeline's
    batches, so only the first pays the broker creating the consumer group its offsets are mirrored to."""
    protocol, plain, bookkeeping, plain_commit, n = [], [], [], [], 0
    for i in range(rounds):
        with (
            time_spent(DeltaRs, "ledger", "commit") as spent,
            time_spent(batch_module, "plan_batch") as planning,
            time_spent(KafkaCluster, "prepare_group_offsets", "commit_group_offsets") as group,
        ):
            n, seconds = timed_ingest(spark, make_cfg("bench_eo", f"bench_eo_{i}"))
        protocol.append(seconds)
        bookkeeping.append(sum(spent.values()) + sum(planning.values()) + sum(group.values()))
        _, seconds, commit_seconds = plain_append(spark, make_cfg(f"bench_plain_{i}", f"bench_plain_{i}"))
        plain.append(seconds)
        plain_commit.append(commit_seconds)
    return {
        "records": n,
        "protocol": statistics.median(protocol),
        "plain": statistics.median(plain),
        "bookkeeping": statistics.median(bookkeeping),
        "bookkeeping_rounds": bookkeeping,
        "plain_commit": statistics.median(plain_commit),
    }


def stream_latency(spark, cfg, bootstrap: str, topic: str, samples: int = 12) -> tuple[list[float], list[float]]:
    """Seconds from a transaction's commit in Kafka to the Delta commit holding it; and batch times."""
    stop = threading.Event()
    covered: list[tuple[float, dict]] = []  # (when its Delta commit returned, range ends) per committed batch

    def on_batch(result):
        if result.status == "committed":
            covered.append((time.perf_counter(), {(r.topic, r.partition): r.end for r in result.ranges}))

    worker = threading.Thread(target=stream, args=(spark, cfg, stop), kwargs={"interval": 0.1, "on_batch": on_batch})
    worker.start()
    producer = Producer(kafka_conf(bootstrap, **{"transactional.id": f"bench-{uuid.uuid4().hex[:6]}"}))
    producer.init_transactions(10)
    sent: list[tuple[float, dict]] = []
    for _i in range(samples):
        time.sleep(1.0)
        offsets = {}
        producer.begin_transaction()
        for j in range(10):
            producer.produce(
                topic,
                value=b'{"event_id":"s","user_id":1}',
                partition=j % 4,
                on_delivery=lambda err, msg, offsets=offsets: offsets.__setitem__(
                    (msg.topic(), msg.partition()), max(offsets.get((msg.topic(), msg.partition()), -1), msg.offset())
                ),
            )
        producer.commit_transaction(10)
        sent.append((time.perf_counter(), dict(offsets)))
    deadline = time.perf_counter() + 30
    while time.perf_counter() < deadline and not all(_when_covered(covered, o) for _, o in sent):
        time.sleep(0.1)
    stop.set()
    worker.join()
    latencies = [_when_covered(covered, o) - t for t, o in sent if _when_covered(covered, o)]
    batch_seconds = [b - a for (a, _), (b, _) in zip(covered, covered[1:])]
    return latencies, batch_seconds


def _when_covered(covered: list[tuple[float, dict]], offsets: dict) -> float | None:
    """When the first Delta commit at or past every one of these offsets returned."""
    need = dict(offsets)
    for when, ends in covered:
        for tp in [tp for tp, o in need.items() if ends.get(tp, -1) > o]:
            del need[tp]
        if not need:
            return when
    return None


class PeakMemory(BackgroundSampler):
    """Peak resident memory of this process and of every process under it (the JVM, Spark's Python workers)
    while the block runs: each one's high-water mark (VmHWM), reset where the block starts (clear_refs 5)
    for the processes running then, read 4x a second and once at the end (a process that ends meanwhile
    gives its last reading): VmRSS sampled as often could miss a worker's peak in a 1M-record batch of
    under a second. The JVM, the driver and the daemon's forks all run before the block."""

    interval = 0.25

    def __init__(self):
        super().__init__()
        self.peaks: dict[int, tuple[str, int]] = {}

    @staticmethod
    def processes() -> set[int]:
        """This process and every process under it."""
        return _descendants(os.getpid()) | {os.getpid()}

    def __enter__(self):
        for pid in self.processes():
            with contextlib.suppress(OSError):  # ended meanwhile
                Path(f"/proc/{pid}/clear_refs").write_text("5")
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.sample()

    def sample(self) -> None:
        for pid in self.processes():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            hwm = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
            self.peaks[pid] = (cmd, max(hwm, self.peaks.get(pid, ("", 0))[1]))

    def by_role(self) -> dict[str, float]:
        """MB: the driver (this Python), the JVM, the largest Python worker. The broker is a child of
        this process too, but it holds the whole topic in memory: it is not offsetlake's, so left out."""
        roles = {"driver (python)": 0, "jvm": 0, "python worker (largest)": 0}
        for pid, (cmd, kb) in self.peaks.items():
            if pid == os.getpid():
                role = "driver (python)"
            elif "java" in cmd.split(" ")[0]:
                role = "jvm"
            elif "pyspark" in cmd or "offsetlake.spark" in cmd:
                # Spark's Python daemon and the workers it forks: `python -m offsetlake.spark.prewarm` in a
                # local session (forks keep its command line), pyspark.daemon's or ours otherwise
                role = "python worker (largest)"
            else:
                continue
            roles[role] = max(roles[role], kb)
        return {k: round(v / 1024, 1) for k, v in roles.items()}


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def airflow_runs(bootstrap: str, work: Path, small: int = 1000, large: int = 1_000_000) -> dict:
    """Seconds through real Airflow processes: trigger -> end of an ingest run that finds nothing to do
    (median of 3), trigger -> Delta commit of a triggered small batch (median of 3), and of one batch
    of `large` records (0: none), with where that run's time went (`spark_submit_timeline`)."""
    from offsetlake.protocol.ledger import pipeline_history
    from offsetlake_local import stack
    from support import load, write_pipeline

    topic = topic_name("airflow")
    create_topic(bootstrap, topic)
    pipelines = work / "pipelines"
    # --client-config reaches the Airflow tasks as ${ENV} references: the pipeline file holds no secret.
    client = {}
    for i, (key, value) in enumerate(sorted(CLIENT.items())):
        os.environ[f"OFFSETLAKE_BENCH_CLIENT_{i}"] = value
        client[key] = "${" + f"OFFSETLAKE_BENCH_CLIENT_{i}" + "}"
    name = write_pipeline(
        pipelines,
        bootstrap,
        [topic],
        work / "lake",
        schedule=None,
        kafka={"client": client},
        format={"type": "raw", "schema": []},
        batch={"max_records_per_batch": max(large, small), "max_records_per_task": 250_000},
    )
    PIPELINES.add(name)
    cfg = load(pipelines, name)
    home = work / "airflow"
    env = stack.environment(home, broker.free_port(), REPO, pipelines, spark_master="local[2]")
    out: dict = {}

    def committed(run_id: str, started: float) -> HistoryEntry:
        while True:
            entry = next(
                (
                    h
                    for h in pipeline_history(cfg.table_location, open_table(cfg.table_location), name, limit=3)
                    if h.meta.run.run_id == run_id
                ),
                None,
            )
            if entry:
                return entry
            assert time.perf_counter() - started < 300, "no commit within 300 s"
            time.sleep(0.2)

    try:
        stack.start(env)
        api = stack.Api(env["AIRFLOW__API__BASE_URL"], stack.USER, stack.password(home))
        dag_id = f"offsetlake__{name}__ingest"
        api.wait_for_dag(dag_id)
        api.unpause(dag_id)
        produce(bootstrap, topic, small)
        produced = small
        assert api.wait_for_run(dag_id, api.trigger(dag_id)) == "success"  # creates the table
        idle, commit = [], []
        for _ in range(3):
            started = time.perf_counter()
            assert api.wait_for_run(dag_id, api.trigger(dag_id), timeout=300) == "success"
            idle.append(time.perf_counter() - started)
        for _ in range(3):
            produce(bootstrap, topic, small, start=produced)
            produced += small
            started = time.perf_counter()
            run_id = api.trigger(dag_id)
            committed(run_id, started)
            commit.append(time.perf_counter() - started)
            api.wait_for_run(dag_id, run_id, timeout=300)
        out.update(idle_run_seconds=idle, small_batch_commit_seconds=commit)
        if large:
            produce(bootstrap, topic, large, start=produced)
            with ProcessStarts(since=time.time()) as starts:
                triggered, started = time.time(), time.perf_counter()
                run_id = api.trigger(dag_id)
                entry = committed(run_id, started)
                api.wait_for_run(dag_id, run_id, timeout=300)
            assert entry.meta.records.read == large, f"the run read {entry.meta.records.read}, not {large}"
            task, report = task_of(api, dag_id, run_id)
            out["large_batch"] = spark_submit_timeline(
                large, triggered, task, starts.started, report, entry.timestamp / 1000
            )
    finally:
        stack.stop(home)
    return out


class ProcessStarts(BackgroundSampler):
    """When the processes of a spark-submit started: the first of each role that started at or after
    `since` (epoch seconds), from /proc/<pid>/stat, so exact to the kernel's clock tick however late a
    sample sees the process."""

    interval = 0.05
    ROLES = {
        # bin/spark-submit runs Spark's launcher (a JVM) to build the command, then execs SparkSubmit's JVM
        # in its own process: this is that process, and the start the driver's start-up line counts from
        "spark-submit": lambda argv: (
            "org.apache.spark.deploy.SparkSubmit" in argv and "org.apache.spark.launcher.Main" not in argv
        ),
        "daemon": lambda argv: "offsetlake.spark.daemon" in argv or "pyspark.daemon" in argv,
    }

    def __init__(self, since: float):
        super().__init__()
        self.since = since
        self.started: dict[str, float] = {}
        self._known: set[str] = set()  # pids given a role (a pid seen between fork and exec is looked at again)

    def sample(self) -> None:
        from offsetlake.spark.session import process_started

        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or entry.name in self._known:
                continue
            try:
                argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
            except OSError:
                continue
            started = process_started(entry.name)
            for role, matches in self.ROLES.items():
                if started is not None and matches(argv) and started >= self.since - 0.01:
                    self._known.add(entry.name)
                    self.started[role] = min(started, self.started.get(role, started))


STARTUP = re.compile(
    r"start-up, seconds after spark-submit's JVM started: Python driver ([0-9.]+), Spark session "
    r"ready ([0-9.]+), first Spark job ([0-9.]+) to ([0-9.]+)"
)


def task_of(api, dag_id: str, run_id: str) -> tuple[float, dict[str, float]]:
    """When the run's task started (epoch seconds, as Airflow recorded it), and the start-up line
    `offsetlake ingest` printed to its log (spark.startup_report), in seconds after spark-submit's JVM."""
    import datetime as dt

    run = f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}"
    tis = [ti for ti in api.get(f"{run}/taskInstances")["task_instances"] if ti.get("start_date")]
    for ti in tis:
        log = json.dumps(api.get(f"{run}/taskInstances/{ti['task_id']}/logs/{ti['try_number']}"))
        found = STARTUP.search(log)
        if found:
            driver, session, job, job_end = map(float, found.groups())
            return (
                dt.datetime.fromisoformat(ti["start_date"]).timestamp(),
                {"driver": driver, "session": session, "job": job, "job_end": job_end},
            )
    print(f"bench: no start-up line in the task logs of {run_id} (an offsetlake that does not print one?)")
    return min(dt.datetime.fromisoformat(ti["start_date"]).timestamp() for ti in tis), {}


def spark_submit_timeline(
    records: int, triggered: float, task: float, starts: dict[str, float], report: dict[str, float], commit: float
) -> dict:
    """Where a triggered run's time went, trigger -> Delta commit, as (step, seconds) in order."""
    jvm = starts.get("spark-submit")

    def after_jvm(key: str) -> float | None:
        return None if jvm is None or key not in report else jvm + report[key]

    marks = [
        ("trigger -> the Airflow task starts (scheduler, executor)", task),
        ("-> spark-submit starts (task runner; operator: pipeline, connections, anything to do?)", jvm),
        ("-> the Python driver starts (Spark's launcher, SparkSubmit's JVM)", after_jvm("driver")),
        ("-> the Spark session is ready (SparkContext, SparkSession; local: the warm-up job)", after_jvm("session")),
        ("-> the batch's Spark job is submitted (the plan was made meanwhile)", after_jvm("job")),
        ("-> the job ends", after_jvm("job_end")),
        ("-> the Delta commit", commit),
    ]
    steps, last = [], triggered
    for label, at in marks:
        if at is None:
            steps.append((label, None))
            continue
        steps.append((label, at - last))
        last = at
    daemon = starts.get("daemon")
    return {
        "records": records,
        "trigger_to_commit_seconds": commit - triggered,
        "steps": steps,
        "daemon_after_job_submitted_seconds": None
        if daemon is None or after_jvm("job") is None
        else daemon - after_jvm("job"),
    }


def airflow_targets(result: dict) -> list[tuple[str, str, bool]]:
    idle, commit = (statistics.median(result[k]) for k in ("idle_run_seconds", "small_batch_commit_seconds"))
    return [
        (
            f"airflow: ingest run with nothing to do, trigger -> run end, median {idle:.1f}s of "
            f"{[round(x, 1) for x in result['idle_run_seconds']]}",
            "< 10s",
            idle < 10,
        ),
        (
            f"airflow: triggered 1,000-record batch, trigger -> Delta commit, median {commit:.1f}s of "
            f"{[round(x, 1) for x in result['small_batch_commit_seconds']]}",
            "< 30s",
            commit < 30,
        ),
    ]


def print_timeline(result: dict) -> None:
    """The triggered large batch, step by step (reported, no target: the steps are Airflow's and Spark's)."""
    large = result.get("large_batch")
    if not large:
        return
    print(
        f"\nairflow: a triggered {large['records']:,}-record batch, trigger -> Delta commit "
        f"{large['trigger_to_commit_seconds']:.2f}s (one run, spark-submit on local[2]):"
    )
    for label, seconds in large["steps"]:
        print(f"  {label:<96} {'(not seen)' if seconds is None else f'{seconds:6.2f}s'}")
    lead = large["daemon_after_job_submitted_seconds"]
    if lead is not None:
        when = f"{lead:.2f}s after" if lead >= 0 else f"{-lead:.2f}s before"
        print(f"  (Spark's Python daemon started {when} the job was submitted)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--scale-records", type=int, default=10_000_000, help="0 skips the scale run")
    parser.add_argument("--airflow-only", action="store_true", help="only the runs through real Airflow processes")
    parser.add_argument("--formats-only", action="store_true", help="only the raw read and the four formats' ingests")
    parser.add_argument("--memory-only", action="store_true", help="only the one-batch memory lines")
    parser.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        help="run against this Kafka cluster instead of the embedded broker (own topics, deleted after)",
    )
    parser.add_argument(
        "--registry", metavar="URL", help="a Schema Registry for the Avro line (default: the embedded one)"
    )
    parser.add_argument(
        "--client-config",
        metavar="FILE",
        help="librdkafka settings (key=value lines: security.protocol, sasl.*, ssl.*) for every client",
    )
    parser.add_argument(
        "--first-ingest", nargs=4, metavar=("BOOTSTRAP", "TOPIC", "LAKE", "NAME"), help=argparse.SUPPRESS
    )  # the child process of median_first_ingest
    parser.add_argument(
        "--memory-ingest", nargs=4, metavar=("BOOTSTRAP", "TOPIC", "LAKE", "NAME"), help=argparse.SUPPRESS
    )  # the child process of memory_ingest
    args = parser.parse_args()
    if args.client_config and not Path(args.client_config).is_file():
        parser.error(f"--client-config {args.client_config}: no such file")
    child = args.first_ingest or args.memory_ingest  # this process is one of in_a_new_process's
    if child:
        if os.environ.get(CLIENT_CONFIG_ENV):
            CLIENT.update(read_client_config(os.environ[CLIENT_CONFIG_ENV]))
        bootstrap, topic, lake, name = child
        (first_ingest_here if args.first_ingest else memory_ingest_here)(bootstrap, topic, Path(lake), name)
        return
    with work_directory("offsetlake-bench-") as work:
        bench(args, work)


@contextlib.contextmanager
def work_directory(prefix: str):
    """A run's temporary directory (the broker's logs, the tables, Airflow: gigabytes a run), removed at its
    end; a failed run keeps it and names it."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield work
    except BaseException:
        print(f"the bench failed; its broker's logs and tables are kept in {work}", file=sys.stderr)
        raise
    shutil.rmtree(work, ignore_errors=True)


def bench(args, work: Path) -> None:
    """Everything but a child process's part, in `work`."""
    if args.formats_only:
        formats_only(args, work)
        return
    if args.memory_only:
        memory_only(args, work)
        return
    if args.airflow_only:
        with broker_under_test(args, work) as (bootstrap, _, _):
            result = airflow_runs(bootstrap, work, large=args.records)
        print_timeline(result)
        print_targets(airflow_targets(result))
        return
    lake = work / "lake"
    out: dict = {"records": args.records, "scale_records": args.scale_records}
    with broker_under_test(args, work) as (bootstrap, registry_url, out["broker"]):
        topic = topic_name("events")
        cfg_raw = pipeline("bench_raw", bootstrap, topic, lake, {"type": "raw"})
        create_topic(bootstrap, topic)
        out["produce_seconds"] = produce(bootstrap, topic, args.records)
        cluster = KafkaCluster(cfg_raw.kafka)
        ends = committed_ends(cluster, topic)
        n_raw, raw_s = median_raw_read(bootstrap, topic, ends)

        # The same ingest, each on a fresh table, right after a session starts in a process of its own:
        # the first batch of a session also forks Spark's Python workers and imports the task code in them.
        # One process first, untimed: the embedded broker, just started, compiles its fetch path for readers
        # like these during the first of them (~300 methods and 0.3-0.4 CPU-seconds more than later, from
        # `jstat -compiler` and /proc), which is the broker's start, not a session's first batch; the peer's
        # first batch, measured later, meets a warm broker too.
        first_ingest(bootstrap, topic, lake, "bench_cold_untimed")
        out["first_ingest"] = first = median_first_ingest(bootstrap, topic, lake)
        out["first_ingest_unwarmed"] = median_first_ingest(bootstrap, topic, lake, prewarm=False)
        n_cold, cold_s, out["spark_session_seconds"] = first["records"], first["seconds"], first["session_seconds"]
        spark = build_session("offsetlake-bench")

        n_rawfmt, rawfmt_s, raw_share = median_ingest(
            spark, bootstrap, topic, lake, "bench_raw", {"type": "raw"}, paired_with=ends
        )
        n_json, json_s, json_share = median_ingest(
            spark, bootstrap, topic, lake, "bench_json", JSON_FORMAT, paired_with=ends
        )
        registry_formats = {
            "avro": avro_events(bootstrap, registry_url, lake, args.records),
            "protobuf": protobuf_events(bootstrap, registry_url, args.records),
        }
        n_avro, avro_s, avro_share = median_ingest(
            spark,
            bootstrap,
            topic_name("avro"),
            lake,
            "bench_avro",
            registry_formats["avro"],
            paired_with=committed_ends(cluster, topic_name("avro")),
        )
        n_proto, proto_s, proto_share = median_ingest(
            spark,
            bootstrap,
            topic_name("protobuf"),
            lake,
            "bench_protobuf",
            registry_formats["protobuf"],
            paired_with=committed_ends(cluster, topic_name("protobuf")),
        )
        eo = exactly_once_overhead(
            spark, lambda name, table: pipeline(name, bootstrap, topic, lake, {"type": "raw"}, table=table)
        )
        format_topics = {"raw": topic, "json": topic, "avro": topic_name("avro"), "protobuf": topic_name("protobuf")}
        out["peers"] = peers(bootstrap, format_topics, n_raw, work)
        anchors, anchor = format_anchors(out["peers"], bootstrap, format_topics, cluster)

        produce(bootstrap, topic, 1000, start=args.records)
        n_small, small_s = timed_ingest(spark, cfg_raw)
        latencies, batch_seconds = stream_latency(spark, cfg_raw, bootstrap, topic)
        fetch_bytes = {args.records: largest_fetch_response(bootstrap, topic, 0, 0)}
        spark.stop()  # the Airflow runs and the memory processes start Spark applications of their own
        spark = None
        memory = {args.records: memory_ingest(bootstrap, topic, lake, "bench_memory")}
        out["airflow"] = airflow_runs(bootstrap, work, large=args.records)

        scale = None
        if args.scale_records:
            scale_topic = topic_name("scale")
            create_topic(bootstrap, scale_topic)
            out["scale_produce_seconds"] = produce(bootstrap, scale_topic, args.scale_records)
            scale_ends = committed_ends(cluster, scale_topic)
            n_scale_raw, scale_raw_s = raw_read(bootstrap, scale_topic, scale_ends)
            memory[args.scale_records] = memory_ingest(bootstrap, scale_topic, lake, "bench_scale")
            scale = (n_scale_raw, scale_raw_s)
            fetch_bytes[args.scale_records] = largest_fetch_response(bootstrap, scale_topic, 0, 0)

    raw_rate = n_raw / raw_s
    n_eo, eo_s, plain_s = eo["records"], eo["protocol"], eo["plain"]
    rows = [
        (f"raw read (1 consumer, median of {RUNS})", n_raw, raw_s, raw_rate, 1.0),
        (
            f"first ingest of a session, raw (median of {FIRST_RUNS})",
            n_cold,
            cold_s,
            n_cold / cold_s,
            n_cold / cold_s / raw_rate,
        ),
        (FORMAT_ROWS["raw"], n_rawfmt, rawfmt_s, n_rawfmt / rawfmt_s, raw_share),
        (FORMAT_ROWS["json"], n_json, json_s, n_json / json_s, json_share),
        (FORMAT_ROWS["avro"], n_avro, avro_s, n_avro / avro_s, avro_share),
        (FORMAT_ROWS["protobuf"], n_proto, proto_s, n_proto / proto_s, proto_share),
        ("raw format, exactly-once protocol (median of 5)", n_eo, eo_s, n_eo / eo_s, n_eo / eo_s / raw_rate),
        ("raw format, plain append (median of 5)", n_eo, plain_s, n_eo / plain_s, n_eo / plain_s / raw_rate),
        ("small batch (1,000 new records, warm)", n_small, small_s, n_small / small_s, None),
    ]
    one_batch = memory[args.records]
    rows.append(
        (
            f"one {args.records:,}-record batch, raw, in a new process",
            one_batch["records"],
            one_batch["seconds"],
            one_batch["records"] / one_batch["seconds"],
            one_batch["records"] / one_batch["seconds"] / raw_rate,
        )
    )
    if scale:
        n_scale_raw, scale_raw_s = scale
        scale_raw_rate = n_scale_raw / scale_raw_s
        n_scale, scale_s = memory[args.scale_records]["records"], memory[args.scale_records]["seconds"]
        rows += [
            ("scale: raw read", n_scale_raw, scale_raw_s, scale_raw_rate, 1.0),
            (
                f"scale: one {args.scale_records:,}-record batch, raw, in a new process",
                n_scale,
                scale_s,
                n_scale / scale_s,
                n_scale / scale_s / scale_raw_rate,
            ),
        ]
    print(f"\nbroker: {out['broker']}")
    print(
        f"produced {args.records} records in {out['produce_seconds']:.1f}s; "
        f"Spark session start {out['spark_session_seconds']:.1f}s "
        f"(median of {FIRST_RUNS} new processes, reported apart)"
    )
    print_unwarmed(first, out["first_ingest_unwarmed"])
    print(f"{'measure':<{LABEL_WIDTH}} {'records':>9} {'seconds':>8} {'rec/s':>10} {'of raw read':>12}")
    for row in rows:
        print_row(*row)

    overhead = eo_s / plain_s - 1
    direct = (eo["bookkeeping"] - eo["plain_commit"]) / plain_s
    print(
        f"\nexactly-once bookkeeping, per {n_eo:,}-record batch: {eo['bookkeeping']:.3f}s of ledger, verdict, txn "
        f"commit and clean-up against {eo['plain_commit']:.3f}s for the plain commit; end to end {overhead:+.1%} "
        f"(medians of 5; one run to the next varies by 10-20% here); the bookkeeping of each batch, the first "
        f"creating the pipeline's consumer group: {', '.join(f'{b:.3f}s' for b in eo['bookkeeping_rounds'])}"
    )
    if latencies:
        print(
            f"stream: median time between committed batches "
            f"{statistics.median(batch_seconds) if batch_seconds else 0:.2f}s"
        )
    for records, run in memory.items():
        print(f"peak memory during one {records:,}-record batch in a new process (MB): {run['peak_mb']}")
    print(
        "largest fetch response for a read from offset 0 asking for at most 1 MiB (fetch.max.bytes): "
        + ", ".join(f"{n:,}-record topic {size / 2**20:.0f} MiB" for n, size in fetch_bytes.items())
        + " (a broker that honours fetch.max.bytes answers with at most 1 MiB)"
    )

    ours = {
        "first": n_cold / cold_s,
        "raw": n_rawfmt / rawfmt_s,
        "json": n_json / json_s,
        "avro": n_avro / avro_s,
        "protobuf": n_proto / proto_s,
    }
    targets = [
        *format_targets({k: v for k, v in ours.items() if k != "first"}, anchors, anchor),
        (
            f"first ingest of a session over its warm ones (median of {WARM_RUNS}), median of {FIRST_RUNS} "
            f"processes: "
            f"{first['over_warm'] - 1:+.0%} (first {cold_s:.2f}s)",
            f"within {FIRST_OVER_WARM - 1:+.0%}",
            first["over_warm"] <= FIRST_OVER_WARM,
        ),
        (f"exactly-once bookkeeping {direct:+.1%} of a plain append's batch, timed directly", "<= 3%", direct <= 0.03),
        (
            f"stream latency, Kafka commit -> Delta commit: median {statistics.median(latencies):.2f}s, max "
            f"{max(latencies):.2f}s over {len(latencies)}"
            if latencies
            else "stream latency: no sample",
            "median < 2s",
            bool(latencies) and statistics.median(latencies) < 2,
        ),
        *airflow_targets(out["airflow"]),
    ]
    scale_peaks = memory[args.scale_records]["peak_mb"] if scale else None
    targets += memory_targets(args.records, one_batch["peak_mb"], args.scale_records, scale_peaks)
    if scale:
        rate_1m, rate_scale = (m["records"] / m["seconds"] for m in (one_batch, memory[args.scale_records]))
        targets.append(
            (
                f"scale: a {args.scale_records:,}-record batch at {rate_scale / rate_1m:.0%} "
                f"of a {args.records:,}-record batch's rate (each in a new process)",
                ">= 85%",
                rate_scale >= 0.85 * rate_1m,
            )
        )
    print_peers(out["peers"], ours, raw_rate)
    print_timeline(out["airflow"])
    print_targets(targets)
    out.update(
        {
            "rows": [dict(zip(("measure", "records", "seconds", "rate", "ratio"), r)) for r in rows],
            "exactly_once_overhead": overhead,
            "exactly_once_overhead_direct": direct,
            "exactly_once_seconds": eo,
            "targets": [{"measured": m, "target": t, "met": bool(ok)} for m, t, ok in targets],
            "stream_latency_seconds": latencies,
            "stream_batch_interval_seconds": batch_seconds,
            "one_batch_in_a_new_process": memory,
            "largest_fetch_response_bytes": fetch_bytes,
        }
    )
    RESULTS.write_text(json.dumps(out, indent=2))
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()

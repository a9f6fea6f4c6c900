"""Tables on object storage: a pipeline whose table and quarantine are on an S3-protocol server (moto's, on
loopback), ingested by Spark tasks that write their Parquet files over S3 and committed by delta-rs with
put-if-absent, checked row by row by the oracle; maintenance on the S3 table; the commit refused where
the store's put-if-absent is not configured; the store's own refusal of a second put of a log entry."""

from __future__ import annotations

import uuid

import pytest

from offsetlake.batch import ingest
from offsetlake.formats.columns import table_schema
from offsetlake.operations.compaction import optimize
from offsetlake.operations.maintenance import checkpoint, vacuum
from offsetlake.storage.location import Location
from offsetlake.table import check_store
from support import (
    assert_exactly_once,
    assert_job_failed_in_one_line,
    assert_one_line_failure,
    ingest_process,
    produce,
    run_cli,
    wait_while_running,
    write_pipeline,
)

pytestmark = pytest.mark.slow


def s3_pipeline(pipeline, s3, partitions: int = 2, retry_seconds: int = 120, **storage):
    prefix = f"s3://{s3.bucket}/{uuid.uuid4().hex[:8]}"
    options = s3.storage_options(**storage)
    return pipeline(
        partitions=partitions,
        table={"path": f"{prefix}/table", "storage_options": options, "retry_seconds": retry_seconds},
        quarantine={"path": f"{prefix}/quarantine", "storage_options": options, "retry_seconds": retry_seconds},
    ), prefix


@pytest.fixture
def proxy(s3):
    """The S3 server behind a proxy that injects the store's faults (tests/store_faults.py)."""
    from store_faults import StoreProxy

    proxy = StoreProxy(s3.port)
    yield proxy
    proxy.stop()


def data_files(s3, prefix: str) -> set[str]:
    return {k for k in s3.keys(prefix.split("/", 3)[3] + "/table/") if k.endswith(".parquet") and "_delta_log" not in k}


def test_a_pipeline_on_s3_lands_exactly_once_and_keeps_its_maintenance(spark, pipeline, s3):
    (cfg, topic), prefix = s3_pipeline(pipeline, s3)
    produce(cfg.kafka, topic, 600, seed=28, bad_share=0.03)
    ingest(spark, cfg)
    produce(cfg.kafka, topic, 400, seed=29)
    ingest(spark, cfg)

    keys = s3.keys(prefix.split("/", 3)[3])
    assert any(k.endswith(".parquet") and "/table/" in k for k in keys)  # the executors wrote over S3
    assert any("/table/_delta_log/00000000000000000002.json" in k for k in keys)
    assert any("/quarantine/_delta_log/" in k for k in keys)
    rows = assert_exactly_once(cfg)  # values and the quarantine, read back over S3

    compacted = optimize(cfg.table_location, cfg.name, table_schema(cfg), cfg.table.partition_by, 128)
    assert compacted.files_removed >= 2
    checkpoint(cfg.table_location)
    vacuum(cfg.table_location, cfg.name, retention_hours=1)
    assert assert_exactly_once(cfg) == rows
    assert any(
        "/table/_delta_log/" in k and k.endswith(".checkpoint.parquet") for k in s3.keys(prefix.split("/", 3)[3])
    )


def test_delta_rs_writes_past_the_dynamodb_lock_which_is_why_a_pipeline_may_not_name_it(s3):
    """deltalake 1.6.6 dropped its S3DynamoDbLogStore (delta-io/delta-rs#4464): given
    `AWS_S3_LOCKING_PROVIDER: dynamodb` and a ready lock table (moto's DynamoDB, on the S3 server's port), it
    commits without ever claiming a version there. A pipeline naming the lock is therefore refused (below);
    if a later delta-rs claims versions again, this test says so."""
    import boto3
    import pyarrow as pa
    from deltalake import write_deltalake

    lock_table = f"delta_log_{uuid.uuid4().hex[:8]}"
    dynamodb = boto3.client(
        "dynamodb",
        endpoint_url=s3.url,
        aws_access_key_id=s3.access_key,
        aws_secret_access_key=s3.secret_key,
        region_name="us-east-1",
    )
    keys = [("tablePath", "HASH"), ("fileName", "RANGE")]  # the schema the lock store documented
    dynamodb.create_table(
        TableName=lock_table,
        AttributeDefinitions=[{"AttributeName": name, "AttributeType": "S"} for name, _ in keys],
        KeySchema=[{"AttributeName": name, "KeyType": kind} for name, kind in keys],
        BillingMode="PAY_PER_REQUEST",
    )
    options = {k: v for k, v in s3.storage_options().items() if k != "conditional_put"}
    options |= {"AWS_S3_LOCKING_PROVIDER": "dynamodb", "DELTA_DYNAMO_TABLE_NAME": lock_table}
    options |= {"AWS_ENDPOINT_URL_DYNAMODB": s3.url}
    prefix = uuid.uuid4().hex[:8]
    for n in range(3):
        write_deltalake(f"s3://{s3.bucket}/{prefix}/t", pa.table({"n": [n]}), mode="append", storage_options=options)

    assert any(k.endswith("00000000000000000002.json") for k in s3.keys(prefix))  # three commits landed
    assert dynamodb.scan(TableName=lock_table)["Items"] == []  # and not one was claimed in the lock table


@pytest.mark.parametrize(
    "given, expected",
    [
        ({}, ("put-if-absent", "conditional_put: etag")),
        ({"AWS_S3_LOCKING_PROVIDER": "dynamodb"}, ("AWS_S3_LOCKING_PROVIDER", "not supported", "conditional_put")),
    ],
    ids=["nothing", "dynamodb lock"],
)
def test_an_s3_table_without_put_if_absent_is_refused_in_one_line_and_nothing_is_written(
    pipeline, s3, pipelines_dir, given, expected
):
    prefix = f"s3://{s3.bucket}/{uuid.uuid4().hex[:8]}"
    options = {k: v for k, v in s3.storage_options().items() if k != "conditional_put"} | given
    name = write_pipeline(
        pipelines_dir, "127.0.0.1:1", ["t"], pipelines_dir, table={"path": f"{prefix}/t", "storage_options": options}
    )
    failed = run_cli("ingest", "--pipeline", name, "--pipelines-dir", str(pipelines_dir))

    assert_one_line_failure(failed, f"{prefix}/t", *expected)
    assert s3.keys(prefix.split("/", 3)[3]) == []
    assert s3.secret_key not in failed.stderr


def test_a_zombie_on_an_s3_table_stands_down_when_another_writer_committed_its_batch(
    pipeline, s3, pipelines_dir, tmp_path
):
    """A zombie decides its commit on version 0 and freezes; another writer commits the batch as version
    1; the released zombie's commit is refused (delta-rs sees version 1 on S3) and it stands down."""
    (cfg, topic), prefix = s3_pipeline(pipeline, s3)
    produce(cfg.kafka, topic, 300, seed=30)
    faults = tmp_path / "zombie"
    faults.mkdir()
    zombie = ingest_process(
        cfg, pipelines_dir, env={"OFFSETLAKE_FAULT": "before_commit:pause", "OFFSETLAKE_FAULT_DIR": str(faults)}
    )
    wait_while_running(lambda: (faults / "before_commit.reached").exists(), zombie)

    other = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir))
    assert other.returncode == 0, other.stderr
    (faults / "before_commit.release").touch()
    out, err = zombie.communicate(timeout=300)

    assert zombie.returncode == 0, err
    assert "already committed" in out, out
    assert_exactly_once(cfg)


def test_the_store_refuses_the_second_put_of_a_log_entry_when_two_commits_race(s3):
    """The property every commit rests on, at the store: two writers that both read version N put N+1 at
    once; S3 keeps the first and answers the second 412 (in the server's log), whichever delta-rs saw."""
    import threading

    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    from deltalake.exceptions import CommitFailedError

    uri = f"s3://{s3.bucket}/{uuid.uuid4().hex[:8]}/race"
    options = s3.storage_options()
    rows = pa.table({"n": pa.array([0], pa.int64())})
    write_deltalake(uri, rows, storage_options=options)
    refused_before = s3.log.read_text().count('" 412 ')
    outcomes = []
    for round_ in range(20):
        tables = [DeltaTable(uri, storage_options=options) for _ in range(2)]
        start = threading.Barrier(2)

        def commit(table, n=round_, start=start):
            start.wait()
            try:
                write_deltalake(
                    table,
                    pa.table({"n": pa.array([n], pa.int64())}),
                    mode="append",
                    commit_properties=None,
                    storage_options=options,
                )
                outcomes.append("committed")
            except CommitFailedError:
                outcomes.append("refused")

        threads = [threading.Thread(target=commit, args=(t,)) for t in tables]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if s3.log.read_text().count('" 412 ') > refused_before:
            break
    final = DeltaTable(uri, storage_options=options)
    assert final.version() == outcomes.count("committed")  # every commit that succeeded is one version
    assert s3.log.read_text().count('" 412 ') > refused_before, "the store never refused a second put"


def test_a_commit_whose_answer_the_store_lost_is_known_as_landed_and_keeps_its_files(spark, pipeline, s3, proxy):
    """The store writes the log entry and the connection drops before its answer: the client's retry of
    the put meets its own entry (412). The commit path finds its attempt id in the log, counts the batch
    committed once, and keeps the files that commit references (taking it for another writer's commit
    would have deleted them)."""
    from offsetlake.operations.status import history

    (cfg, topic), _ = s3_pipeline(pipeline, s3, AWS_ENDPOINT_URL=proxy.url)
    produce(cfg.kafka, topic, 500, seed=31)
    ingest(spark, cfg)  # the table exists: the lost answer is a batch's commit
    produce(cfg.kafka, topic, 300, seed=32)
    proxy.lose_next_commit_response()
    results = ingest(spark, cfg)

    assert proxy.seen["lost commit responses"] == 1
    assert [r.status for r in results][0] == "committed"
    ingests = [h.meta.batch for h in history(cfg, 20) if h.meta.kind == "ingest"]
    assert sorted(ingests) == sorted(set(ingests))  # each batch committed once
    assert_exactly_once(cfg)


def test_a_log_entry_put_whose_connection_the_store_reset_is_made_again(spark, pipeline, s3, proxy):
    """A store restarting mid-request resets a put's connection before storing it, and the object-store
    client does not retry a put it cannot know the fate of (met by a stream in a chaos run, creating its
    quarantine while the store restarted). The table's creation and a batch's commit each meet one: both
    are made again within table.retry_seconds, and every record lands once."""
    (cfg, topic), _ = s3_pipeline(pipeline, s3, AWS_ENDPOINT_URL=proxy.url)
    produce(cfg.kafka, topic, 500, seed=36)
    proxy.reset_next_commit()  # the first log entry put is the table's creation (its version 0)
    assert [r.status for r in ingest(spark, cfg)][0] == "committed"
    produce(cfg.kafka, topic, 300, seed=37)
    proxy.reset_next_commit()  # now a batch's commit
    results = ingest(spark, cfg)

    assert proxy.seen["reset commits"] == 2
    assert [r.status for r in results][0] == "committed"
    assert_exactly_once(cfg)


def test_a_store_answering_503_for_seconds_is_ridden_out(spark, pipeline, s3, proxy):
    (cfg, topic), _ = s3_pipeline(pipeline, s3, AWS_ENDPOINT_URL=proxy.url)
    produce(cfg.kafka, topic, 400, seed=33)
    proxy.refuse_for(4)
    ingest(spark, cfg)

    assert proxy.seen["refused"] > 0
    assert_exactly_once(cfg)


def test_past_retry_seconds_a_refused_commit_fails_in_one_line_and_leaves_nothing_half_written(
    pipeline, s3, proxy, pipelines_dir
):
    (cfg, topic), prefix = s3_pipeline(pipeline, s3, retry_seconds=3, AWS_ENDPOINT_URL=proxy.url)
    produce(cfg.kafka, topic, 300, seed=34)
    run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir), check=True)
    committed = data_files(s3, prefix)
    produce(cfg.kafka, topic, 200, seed=35)
    proxy.refuse_commits_for(600)

    failed = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir))

    assert_job_failed_in_one_line(failed, "did not land", "503 Service Unavailable", cfg.table_path)
    assert proxy.seen["refused commits"] > 0
    assert data_files(s3, prefix) == committed  # the attempt's Parquet files went with it
    proxy.refuse_commits_for(0)
    run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir), check=True)
    assert_exactly_once(cfg)


@pytest.mark.parametrize(
    "where, expected",
    [("endpoint", "cannot reach the endpoint http://127.0.0.1:"), ("bucket", "404 Not Found (no such bucket)")],
)
def test_a_wrong_endpoint_or_bucket_is_one_line_naming_the_table_before_spark_starts(
    bootstrap, s3, pipelines_dir, where, expected
):
    from hosts import free_port

    prefix = f"s3://{'no-such-bucket' if where == 'bucket' else s3.bucket}/{uuid.uuid4().hex[:8]}"
    options = s3.storage_options(
        **({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"} if where == "endpoint" else {})
    )
    name = write_pipeline(
        pipelines_dir,
        bootstrap,
        ["t"],
        pipelines_dir,
        # An endpoint that does not answer may be a store restarting: asked again for retry_seconds.
        table={"path": f"{prefix}/t", "storage_options": options, "retry_seconds": 3},
    )
    failed = run_cli("ingest", "--pipeline", name, "--pipelines-dir", str(pipelines_dir))

    assert_one_line_failure(failed, f"table {prefix}/t: the object store refused to list it", expected)
    if where == "endpoint":
        assert "(for 3 s: table.retry_seconds)" in failed.stderr
    assert "Spark" not in failed.stderr and "JAVA" not in failed.stdout
    assert s3.secret_key not in failed.stderr
    assert s3.keys(prefix.split("/", 3)[3]) == []


@pytest.fixture(scope="module")
def guarded_s3(tmp_path_factory):
    """A second S3 server that, unlike the session's, checks credentials: only its IAM user's key is let in."""
    from hosts import S3Server

    server = S3Server.start(tmp_path_factory.mktemp("guarded-s3"), checks_credentials=True)
    yield server
    server.stop()


@pytest.mark.parametrize("wrong", ["secret", "access key"])
def test_a_wrong_credential_is_one_line_naming_the_table_before_spark_starts(
    bootstrap, guarded_s3, pipelines_dir, wrong
):
    prefix = f"s3://{guarded_s3.bucket}/{uuid.uuid4().hex[:8]}"
    right = guarded_s3.storage_options()
    check_store(Location.of(f"{prefix}/t", right))  # the right key lists the (empty) location: the server lets it in
    wrong_key = "AKIAWRONGKEY00000000" if wrong == "access key" else right["AWS_ACCESS_KEY_ID"]
    options = guarded_s3.storage_options(AWS_ACCESS_KEY_ID=wrong_key, AWS_SECRET_ACCESS_KEY="not-the-secret")
    name = write_pipeline(
        pipelines_dir, bootstrap, ["t"], pipelines_dir, table={"path": f"{prefix}/t", "storage_options": options}
    )

    failed = run_cli("ingest", "--pipeline", name, "--pipelines-dir", str(pipelines_dir))

    assert_one_line_failure(
        failed,
        f"table {prefix}/t: the object store refused to list it",
        "403 Forbidden (access denied: check the credentials)",
    )
    assert "Spark" not in failed.stderr and "not-the-secret" not in failed.stderr
    assert guarded_s3.keys(prefix.split("/", 3)[3]) == []


def test_credentials_from_an_airflow_aws_connection_reach_every_writer(spark, pipeline, s3):
    """`table.connection` names an amazon-provider connection; its login, password and extra give the
    credentials, endpoint and region (here handed over as the operator hands them to its job)."""
    from offsetlake.config.connections import resolve_connections

    prefix = f"s3://{s3.bucket}/{uuid.uuid4().hex[:8]}"
    cfg, topic = pipeline(
        table={"path": f"{prefix}/table", "storage_options": {"conditional_put": "etag"}, "connection": "lake"},
        quarantine={
            "path": f"{prefix}/quarantine",
            "storage_options": {"conditional_put": "etag"},
            "connection": "lake",
        },
    )
    connection = {
        "conn_type": "aws",
        "login": s3.access_key,
        "password": s3.secret_key,
        "extra": {"region_name": "us-east-1", "endpoint_url": s3.url},
    }
    cfg = resolve_connections(cfg, {"lake": connection})
    produce(cfg.kafka, topic, 300, seed=36, bad_share=0.05)
    ingest(spark, cfg)

    assert s3.secret_key not in repr(cfg)
    assert any(k.endswith(".parquet") for k in s3.keys(prefix.split("/", 3)[3] + "/table/"))
    assert any("/quarantine/_delta_log/" in k for k in s3.keys(prefix.split("/", 3)[3]))
    assert_exactly_once(cfg)

"""The DAGs, run for real with dag.test(): real broker, spark-submit, Delta tables on disk."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable, write_deltalake

from offsetlake.batch import ingest
from offsetlake.table import query
from support import (
    REPO,
    assert_exactly_once,
    assert_rows_are_kafkas_except,
    ledger_offsets,
    pipeline_commits,
    produce,
    table_lineage,
)

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _airflow(airflow_db):
    """Every test here runs DAGs: the Airflow DB must be migrated."""


def run(dag, conf: dict | None = None) -> tuple[str, dict[str, str]]:
    dr = dag.test(run_conf=conf or {})
    states = {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}
    return str(dr.state), states


def step_result(dag, task_id: str):
    """The XCom a step of the DAG's latest run returned."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = (
            session.query(XComModel)
            .filter(XComModel.dag_id == dag.dag_id, XComModel.task_id == task_id, XComModel.key == "return_value")
            .order_by(XComModel.timestamp.desc())
            .first()
        )
        return XComModel.deserialize_value(row)


def full_rows(cfg) -> list[dict]:
    return query(cfg.table_location, "SELECT * FROM t ORDER BY kafka_topic, kafka_partition, kafka_offset").to_pylist()


def test_the_dag_file_parses_into_five_dags_per_pipeline(monkeypatch, airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("OFFSETLAKE_PIPELINES_DIR", str(REPO / "include" / "pipelines"))
    monkeypatch.delenv("OFFSETLAKE_EXAMPLE_CONSUMERS", raising=False)  # no example consumer unless named
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    kinds = ("ingest", "stream", "backfill", "recovery", "maintenance")
    demos = ("demo_events", "demo_avro", "demo_users", "demo_shop")
    assert set(bag.dags) == {f"offsetlake__{p}__{k}" for p in demos for k in kinds}
    ingest_dag = bag.dags["offsetlake__demo_events__ingest"]
    assert ingest_dag.max_active_runs == 1 and not ingest_dag.catchup
    assert type(bag.dags["offsetlake__demo_events__backfill"].timetable).__name__ == "NullTimetable"  # manual only
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from offsetlake.airflow.operator import OffsetlakeOperator

    steps = [t for t in ingest_dag.tasks if isinstance(t, SparkSubmitOperator)]
    assert [type(t) for t in steps] == [OffsetlakeOperator]
    assert steps[0]._conn_id == "spark_default" and (steps[0].pipeline, steps[0].command) == ("demo_events", "ingest")
    # demo_shop writes a table per topic: its steps are mapped over a `tables` task, but its stream's.
    shop = {kind: bag.dags[f"offsetlake__demo_shop__{kind}"] for kind in kinds}
    for kind, step in (("ingest", "ingest"), ("backfill", "backfill"), ("recovery", "recovery")):
        assert shop[kind].task_dict[step].is_mapped and shop[kind].task_dict[step].upstream_task_ids >= {"tables"}
    assert not shop["stream"].task_dict["stream"].is_mapped and "tables" not in shop["stream"].task_dict


def test_nothing_machine_specific_is_baked_into_a_dag(monkeypatch, airflow_db):
    """The DAG is parsed on one machine and run on others: job path, interpreter, driver address
    and pipeline folder are resolved by the worker that runs the task."""
    import sys

    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("OFFSETLAKE_PIPELINES_DIR", str(REPO / "include" / "pipelines"))
    bag = DagBag(dag_folder=str(REPO / "dags"))
    steps = [(dag_id, t) for dag_id, dag in bag.dags.items() for t in dag.tasks if t.task_type == "OffsetlakeOperator"]
    from offsetlake.config import list_pipelines

    # Each demo pipeline's ingest, stream, backfill, recovery and maintenance steps.
    assert len(steps) == 5 * len(list_pipelines(REPO / "include" / "pipelines")) == 20, steps
    for dag_id, t in steps:
        fields = t.partial_kwargs if hasattr(t, "partial_kwargs") else {f: getattr(t, f) for f in t.template_fields}
        baked = json.dumps(fields, default=str)  # a mapped step (a table per topic): what .partial() gave
        for machine_specific in ("127.0.0.1", "localhost", sys.executable, str(REPO)):
            assert machine_specific not in baked, (dag_id, t.task_id, machine_specific)


def test_ingest_dag_commits_with_airflow_coordinates_and_reports_what_it_committed(pipeline):
    from offsetlake.airflow.dags import ingest_dag

    cfg, topic = pipeline(records=600)

    state, tasks = run(ingest_dag(cfg))

    assert state == "success", tasks
    assert_exactly_once(cfg)
    last = pipeline_commits(cfg)[-1]
    assert last.meta.run.by == "airflow" and last.meta.run.dag_id == f"offsetlake__{cfg.name}__ingest"
    assert last.meta.run.run_id and last.meta.run.try_number == 1
    result = step_result(ingest_dag(cfg), "ingest")
    assert result["submitted"] is True and result["versions"][-1] == last.version
    assert result["ranges"] == {topic: {str(p): [0, o] for (_, p), o in ledger_offsets(cfg).items()}}

    # Nothing new: the step decides so without submitting a Spark job and commits nothing.
    state, tasks = run(ingest_dag(cfg))
    assert (state, tasks) == ("success", {"ingest": "success"}), tasks
    assert step_result(ingest_dag(cfg), "ingest") | {"table": None} == {
        "pipeline": cfg.name,
        "table": None,
        "versions": [],
        "kinds": [],
        "rows": 0,
        "ranges": {},
        "submitted": False,
    }
    assert pipeline_commits(cfg)[-1].version == last.version


def test_a_pipeline_with_a_table_per_topic_maps_one_ingest_task_per_table(
    spark, bootstrap, pipelines_dir, lake, monkeypatch
):
    """A `tables` task lists the tables as of the run; the Spark step runs once per table, labelled with
    its name: the table already caught up submits no Spark job, the other commits its topic exactly once."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    from offsetlake.airflow.dags import ingest_dag
    from offsetlake.config.topic_tables import for_topic
    from support import create_topic, load, unique, write_per_topic_pipeline

    monkeypatch.setenv("OFFSETLAKE_PIPELINES_DIR", str(pipelines_dir))  # the DAG file and the tasks read it
    prefix = unique("db")
    for table in ("a", "b"):
        create_topic(bootstrap, f"{prefix}.{table}", 2)
    name = write_per_topic_pipeline(pipelines_dir, bootstrap, prefix, lake)
    cfg = load(pipelines_dir, name)
    tables = {t: for_topic(cfg, f"{prefix}.{t}") for t in ("a", "b")}
    for one in tables.values():
        produce(one.kafka, one.topics[0], 200, transactional_share=0.5, abort_share=0.2, seed=3)
    ingest(spark, tables["a"])

    dag = ingest_dag(cfg)
    state, states = run(dag)

    assert state == "success", states
    with create_session() as session:
        mapped = session.query(TaskInstance).filter_by(dag_id=dag.dag_id, task_id="ingest").all()
        labels = {ti.map_index: ti.rendered_map_index for ti in mapped}
        assert sorted(labels.values()) == ["a", "b"] and all(str(ti.state) == "success" for ti in mapped)
    from airflow.models.xcom import XComModel

    with create_session() as session:
        results = {
            labels[x.map_index]: XComModel.deserialize_value(x)
            for x in session.query(XComModel).filter_by(dag_id=dag.dag_id, task_id="ingest", key="return_value")
        }
    assert results["a"]["submitted"] is False and results["a"]["versions"] == []
    assert results["b"]["submitted"] is True and results["b"]["table"] == str(lake / "b")
    for one in tables.values():
        assert_exactly_once(one)
    b_commit = pipeline_commits(tables["b"])[-1]
    assert b_commit.meta.run.dag_id == dag.dag_id and b_commit.version == results["b"]["versions"][-1]


def test_backfill_dag_twice_gives_the_same_table_and_reports_its_ranges(spark, pipeline):
    from offsetlake.airflow.dags import backfill_dag

    cfg, topic = pipeline(records=600)
    ingest(spark, cfg)
    before = full_rows(cfg)
    conf = {
        "ranges": [
            {"topic": topic, "partition": 0, "start": 5, "end": 120},
            {"topic": topic, "partition": 1, "start": 0, "end": 60},
        ]
    }

    for _ in range(2):
        state, tasks = run(backfill_dag(cfg), conf)
        assert state == "success", tasks

    assert full_rows(cfg) == before
    kinds = [h.meta.kind for h in pipeline_commits(cfg)]
    assert kinds[-2:] == ["backfill", "backfill"]
    assert step_result(backfill_dag(cfg), "backfill")["ranges"] == {topic: {"0": [5, 120], "1": [0, 60]}}
    assert_exactly_once(cfg)


def test_backfill_past_the_ledger_is_refused(spark, pipeline):
    from offsetlake.airflow.dags import backfill_dag

    cfg, topic = pipeline(records=600)
    ingest(spark, cfg)
    end = ledger_offsets(cfg)[(topic, 0)]
    version = DeltaTable(cfg.table_path).version()

    state, tasks = run(backfill_dag(cfg), {"ranges": [{"topic": topic, "partition": 0, "start": 0, "end": end + 10}]})

    assert state == "failed" and tasks["backfill"] == "failed"
    assert DeltaTable(cfg.table_path).version() == version


@pytest.mark.parametrize(
    "conf, why",
    [
        ({"ranges": [{"topic": "TOPIC", "partition": 0, "start": 50, "end": 10}]}, "end < start"),
        ({"ranges": [{"topic": "TOPIC", "partition": 7, "start": 0, "end": 10}]}, "unknown partition"),
        (
            {
                "ranges": [{"topic": "TOPIC", "partition": 0, "start": 0, "end": 10}],
                "time_from": "2026-01-01T00:00:00Z",
                "time_to": "2026-01-02T00:00:00Z",
            },
            "ranges and window",
        ),
        ({}, "nothing asked"),
    ],
)
def test_backfill_form_errors_stop_before_spark(spark, pipeline, conf, why):
    from offsetlake.airflow.dags import backfill_dag

    cfg, topic = pipeline(records=50)
    ingest(spark, cfg)  # a table with a ledger, which a backfill that ran would add a commit to
    before = DeltaTable(cfg.table_path)
    version, files = before.version(), set(before.file_uris())
    conf = json.loads(json.dumps(conf).replace("TOPIC", topic))

    state, tasks = run(backfill_dag(cfg), conf)

    assert state == "failed", why
    assert tasks["validate"] == "failed"
    assert tasks["backfill"] == "upstream_failed"  # the Spark step never ran
    after = DeltaTable(cfg.table_path)  # no commit, no file
    assert (after.version(), set(after.file_uris())) == (version, files)


@pytest.mark.parametrize(
    "conf, field",
    [
        ({"pipeline": "someone_else"}, "pipeline"),  # unknown pipeline
        (
            {"ranges": [{"topic": "TOPIC", "partition": 0, "start": "0; rm -rf /", "end": 10}]},
            "ranges",
        ),  # not an offset
        ({"ranges": [{"topic": "../../etc", "partition": 0, "start": 0, "end": 10}]}, "ranges"),  # path as a topic
        ({"dry_run": "yes"}, "dry_run"),
    ],
)
def test_backfill_form_type_errors_are_rejected_at_trigger(spark, pipeline, conf, field):
    from airflow.sdk.definitions.param import ParamValidationError

    from offsetlake.airflow.dags import backfill_dag

    cfg, topic = pipeline(records=10)
    ingest(spark, cfg)  # a table with a ledger, which a backfill that ran would add a commit to
    before = DeltaTable(cfg.table_path)
    version, files = before.version(), set(before.file_uris())
    conf = json.loads(json.dumps(conf).replace("TOPIC", topic))
    with pytest.raises(ParamValidationError, match=rf"\bparam {field}\b"):  # the field the form refused
        backfill_dag(cfg).test(run_conf=conf)
    after = DeltaTable(cfg.table_path)  # refused before anything ran: no commit, no file
    assert (after.version(), set(after.file_uris())) == (version, files)


@pytest.mark.parametrize("reason", ["x; rm -rf /", "../../etc/passwd", "$(whoami)", "a\nb"])
def test_recovery_reason_with_shell_or_path_is_rejected(spark, pipeline, reason):
    from offsetlake.airflow.dags import recovery_dag

    cfg, topic = pipeline(records=10)
    ingest(spark, cfg)  # a table with a ledger, which a reset that ran would add a commit to
    before = DeltaTable(cfg.table_path)
    version, files = before.version(), set(before.file_uris())
    conf = {"reset": True, "reset_offsets": [{"topic": topic, "partition": 0, "offset": 0}], "reset_reason": reason}

    state, tasks = run(recovery_dag(cfg), conf)

    assert state == "failed" and tasks["validate"] == "failed" and tasks["recovery"] == "upstream_failed"
    after = DeltaTable(cfg.table_path)  # no reset was committed: no commit, no file
    assert (after.version(), set(after.file_uris())) == (version, files)


def test_recovery_dag_audits_and_repairs_injected_damage(spark, pipeline):
    from offsetlake.airflow.dags import recovery_dag

    cfg, topic = pipeline(records=800)
    ingest(spark, cfg)
    DeltaTable(cfg.table_path).delete("kafka_partition = 0 AND kafka_offset < 40")
    write_deltalake(
        cfg.table_path,
        query(cfg.table_location, "SELECT * FROM t WHERE kafka_partition = 1 AND kafka_offset < 10"),
        mode="append",
    )

    state, tasks = run(recovery_dag(cfg))  # audit only: finds the damage and fails loudly
    assert state == "failed" and tasks["recovery"] == "failed"

    state, tasks = run(recovery_dag(cfg), {"repair": True, "cleanup": True})
    assert state == "success", tasks
    assert_exactly_once(cfg)


def test_recovery_dag_reset_moves_the_ledger(spark, pipeline):
    from offsetlake.airflow.dags import recovery_dag

    cfg, topic = pipeline(partitions=1, records=200)
    ingest(spark, cfg)
    end = ledger_offsets(cfg)[(topic, 0)]
    produce(cfg.kafka, topic, 100, transactional_share=0.0, seed=4)

    state, tasks = run(
        recovery_dag(cfg),
        {
            "reset": True,
            "reset_reason": "skip a bad deploy (INC-42)",
            "reset_offsets": [{"topic": topic, "partition": 0, "offset": end + 30}],
        },
    )

    assert state == "success", tasks
    last = pipeline_commits(cfg)[-1]
    assert last.meta.kind == "reset" and last.meta.reason == "skip a bad deploy (INC-42)"
    ingest(spark, cfg)
    assert pipeline_commits(cfg)[-1].meta.ranges[topic]["0"][0] == end + 30
    assert_rows_are_kafkas_except(cfg, topic, 0, range(end, end + 30))  # before the reset and after it, row by row


def test_stream_dag_runs_for_a_bounded_time(pipeline):
    from offsetlake.airflow.dags import stream_dag

    cfg, topic = pipeline(records=300)
    bound = 12

    dr = stream_dag(cfg).test(run_conf={"max_seconds": bound})

    assert str(dr.state) == "success"
    step = next(ti for ti in dr.get_task_instances() if ti.task_id == "stream")
    ran = (step.end_date - step.start_date).total_seconds()
    # It streamed until the bound (no sooner), then stopped by itself: not the default 3300 s.
    # The slack covers spark-submit's JVM start and the batch in flight at the deadline.
    assert bound <= ran < bound + 150, ran
    mine = [h for h in pipeline_commits(cfg) if h.meta.run.is_task_try(stream_dag(cfg).dag_id, dr.run_id, None)]
    assert mine and all(h.meta.kind == "ingest" and h.meta.run.via == "stream" for h in mine)
    assert_exactly_once(cfg)


@pytest.mark.parametrize(
    "mode, ingest_timetable, stream_timetable",
    [
        ("batch", "CronTriggerTimetable", "NullTimetable"),
        ("stream", "NullTimetable", "ContinuousTimetable"),
    ],
)
def test_the_mode_decides_which_dag_is_scheduled(pipeline, mode, ingest_timetable, stream_timetable):
    from offsetlake.airflow.dags import ingest_dag, stream_dag

    cfg, _ = pipeline(mode=mode)
    ingest, stream = ingest_dag(cfg), stream_dag(cfg)
    assert (type(ingest.timetable).__name__, type(stream.timetable).__name__) == (ingest_timetable, stream_timetable)
    assert ingest.max_active_runs == stream.max_active_runs == 1  # the continuous stream: one run at a time


def test_steps_that_a_schedule_relies_on_are_retried_and_refusals_are_not(pipeline):
    from offsetlake.airflow.dags import pipeline_dags

    cfg, _ = pipeline(airflow={"retries": 7, "retry_delay_seconds": 5})
    steps = {t.task_id: t for dag in pipeline_dags(cfg) for t in dag.tasks if t.task_type == "OffsetlakeOperator"}
    assert {k: t.retries for k, t in steps.items()} == {
        "ingest": 7,
        "stream": 7,
        "maintenance": 7,
        "backfill": 0,
        "recovery": 0,
    }
    assert steps["stream"].retry_exponential_backoff and steps["stream"].retry_delay.total_seconds() == 5
    default, _ = pipeline()
    assert {
        t.task_id: t.retries for dag in pipeline_dags(default) for t in dag.tasks if t.task_id in ("ingest", "stream")
    } == {"ingest": 3, "stream": 5}


def test_a_broker_outage_longer_than_retry_seconds_is_carried_by_the_stream_dags_retries(
    own_broker, pipelines_dir, lake, monkeypatch
):
    """The stream outlives a restart shorter than kafka.retry_seconds (tests/integration/test_broker_restart.py);
    past it the stream exits with one line, and Airflow's retries take over until the broker is back."""
    from offsetlake.airflow.dags import stream_dag
    from support import new_pipeline, produce

    monkeypatch.setenv("OFFSETLAKE_PIPELINES_DIR", str(pipelines_dir))
    cfg, topic = new_pipeline(
        own_broker.bootstrap_servers,
        pipelines_dir,
        lake,
        partitions=2,
        records=300,
        kafka={"retry_seconds": 2, "timeout_seconds": 2},
        stream_interval_seconds=0.5,
        airflow={"retries": 6, "retry_delay_seconds": 1},
    )
    outage = {}
    dag = stream_dag(cfg)

    def break_the_broker():
        deadline = time.monotonic() + 240
        while not _committed(cfg) and time.monotonic() < deadline:  # try 1 is streaming
            time.sleep(0.5)
        own_broker.stop()
        # The broker stays away until try 1 has given up (past retry_seconds) and Airflow retries.
        while not _retried(dag.dag_id, "stream") and time.monotonic() < deadline:
            time.sleep(0.5)
        own_broker.start()
        outage["back"] = True
        produce(cfg.kafka, topic, 200, seed=11)

    chaos = threading.Thread(target=break_the_broker)
    chaos.start()
    dr = dag.test(run_conf={"max_seconds": 40})
    chaos.join()

    assert str(dr.state) == "success"
    step = next(ti for ti in dr.get_task_instances() if ti.task_id == "stream")
    assert step.try_number >= 2, "the outage should have failed the first try"
    tries = {h.meta.run.try_number for h in pipeline_commits(cfg) if h.meta.run.run_id == dr.run_id}
    assert 1 in tries and max(tries) == step.try_number, tries  # try 1 committed, the last try did after it
    assert "back" in outage
    assert_exactly_once(cfg)
    assert len(table_lineage(cfg.table_path)) == 500


def _committed(cfg) -> bool:
    return bool(pipeline_commits(cfg))


def _retried(dag_id: str, task_id: str) -> bool:
    """The task's first try has failed: Airflow's metadata database holds a later try, or the first up for retry."""
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tries = session.query(TaskInstance).filter(TaskInstance.dag_id == dag_id, TaskInstance.task_id == task_id).all()
        return any(ti.try_number >= 2 or str(ti.state) == "up_for_retry" for ti in tries)


def test_maintenance_dag_compacts_vacuums_and_checkpoints_without_touching_a_row(spark, pipeline):
    from offsetlake.airflow.dags import maintenance_dag
    from offsetlake.table import committed_files

    cfg, topic = pipeline(records=1200, batch={"max_records_per_batch": 300, "max_records_per_task": 100})
    ingest(spark, cfg)
    before, ledger, files = full_rows(cfg), ledger_offsets(cfg), len(committed_files(cfg.table_location))

    state, tasks = run(maintenance_dag(cfg), {"zorder_by": ["user_id"], "vacuum_retention_hours": 24})

    assert state == "success", tasks
    assert len(committed_files(cfg.table_location)) < files
    assert full_rows(cfg) == before and ledger_offsets(cfg) == ledger
    last = pipeline_commits(cfg)[-1]
    assert last.meta.kind == "optimize" and last.meta.run.dag_id == f"offsetlake__{cfg.name}__maintenance"
    assert list(Path(cfg.table_path, "_delta_log").glob("*.checkpoint.parquet"))
    assert_exactly_once(cfg)


@pytest.mark.parametrize(
    "conf, refused_by",
    [
        # Params reject at trigger time what JSON schema can tell (a minimum, the table's columns)...
        ({"vacuum_retention_hours": 0}, "the form"),
        ({"zorder_by": ["no_such_column"]}, "the form"),
        # ...the validate task the rest, before Spark starts
        ({"optimize": False, "vacuum": False, "checkpoint": False}, "validate"),
    ],
)
def test_maintenance_form_errors_stop_before_spark(pipeline, conf, refused_by):
    from airflow.exceptions import ParamValidationError

    from offsetlake.airflow.dags import maintenance_dag

    cfg, topic = pipeline(records=10)
    dag = maintenance_dag(cfg)
    if refused_by == "the form":
        field = next(iter(conf))
        with pytest.raises(ParamValidationError, match=rf"\bparam {field}\b"):  # the field the form refused
            run(dag, conf)
    else:
        state, tasks = run(dag, conf)
        assert state == "failed" and tasks["validate"] == "failed" and tasks["maintenance"] == "upstream_failed"
    assert not DeltaTable.is_deltatable(cfg.table_path)  # refused before Spark: nothing created or written

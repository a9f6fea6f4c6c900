"""The DAG factory: per pipeline in include/pipelines/, an ingest, a stream, a backfill and a recovery DAG.

dags/offsetlake_pipelines.py only calls build_dags(). Spark steps are
`OffsetlakeOperator`s (spark-submit on the `spark_default` connection), so
delta-rs never runs inside Airflow's forked task processes during a batch.
Trigger forms are Params (types checked by Airflow) plus a `validate` task
(`forms.py`, everything else); Spark steps receive only what `validate`
normalised. Results travel by XCom: each Spark step returns the commits its
task try made. Asset events do not come from tasks: the table's Asset watches
the table (`table_asset`), so a stream's batches, maintenance and changes made
outside Airflow are announced like an ingest.

A pipeline that writes a table per topic (`table.path` with `{table}` or `{topic}`,
offsetlake.config.topic_tables) gets the same DAGs, with the Spark step mapped: a `tables`
task lists the tables as of the run (a topic created since joins), and the step
runs once per table (`.expand(table=...)`, labelled with the table's name), so
each table's state, retries and logs show on their own. Its stream DAG keeps one
task: one Spark session catching up each table in turn.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Asset, AssetWatcher, Param, task

from offsetlake.airflow.operator import RETRIES, OffsetlakeOperator
from offsetlake.airflow.triggers import TableChangeTrigger
from offsetlake.config import PipelineConfig, list_pipelines, load_pipeline
from offsetlake.config.topic_tables import is_pattern, per_topic

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def table_asset(cfg: PipelineConfig | str, table: str | None = None) -> Asset:
    """The pipeline's table as an Airflow Asset, watched: every change of the table is an Asset event
    (`triggers.TableChangeTrigger`). Schedule downstream DAGs on this object (`schedule=[table_asset("P")]`),
    not on a plain `Asset` of the same name, which would define the Asset without its watcher.

    `table`: one table of a pipeline that writes a table per topic (`table_asset("shop", "orders")`)."""
    from offsetlake.config.topic_tables import table_path

    if isinstance(cfg, str):
        cfg = load_pipeline(cfg)
    path = table_path(cfg, table)
    name = cfg.name if table is None else f"{cfg.name}.{table}"
    uri = path if "://" in path else f"file://{path}"
    watcher = AssetWatcher(
        name=f"offsetlake_{name}_changes".replace(".", "_"), trigger=TableChangeTrigger(pipeline=cfg.name, table=path)
    )
    return Asset(name=f"offsetlake.{name}", uri=uri, watchers=[watcher])


def retry_policy(cfg: PipelineConfig, command: str) -> dict:
    """The pipeline's `airflow:` settings over the operator's retry defaults, for the steps that retry."""
    if not RETRIES[command]:
        return {}
    policy: dict[str, Any] = {"retry_delay": dt.timedelta(seconds=cfg.airflow.retry_delay_seconds)}
    if cfg.airflow.retries is not None:
        policy["retries"] = cfg.airflow.retries
    return policy


def _dag(cfg: PipelineConfig, kind: str, **kwargs) -> DAG:
    return DAG(
        dag_id=f"offsetlake__{cfg.name}__{kind}",
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["offsetlake", cfg.name, kind],
        doc_md=(
            f"offsetlake pipeline **{cfg.name}** ({cfg.mode} mode). Lag per partition, recent commits and "
            f"the last audit: this DAG's **offsetlake** tab, or "
            f"[the offsetlake view](/offsetlake/?pipeline={cfg.name})."
        ),
        **kwargs,
    )


def ingest_dag(cfg: PipelineConfig) -> DAG:
    # mode batch: on the pipeline's schedule (`schedule: null`: triggered runs only); mode stream: triggered
    # runs only (a catch-up beside the stream is safe: the ledger serialises them).
    schedule = cfg.schedule if cfg.mode == "batch" else None
    with _dag(
        cfg,
        "ingest",
        schedule=schedule,
        description=f"Ingest {', '.join(cfg.topics)} into {cfg.table_path}, exactly once",
    ) as dag:
        spark_step(cfg, "ingest", "ingest")
    return dag


def stream_dag(cfg: PipelineConfig) -> DAG:
    params = {
        "max_seconds": Param(
            3300,
            type="integer",
            minimum=10,
            maximum=86400,
            description="how long this run streams before the next run takes over",
        )
    }
    # mode stream: one run at a time, the next as soon as one ends (each streams for max_seconds, so a
    # long-lived Spark session is renewed hourly); mode batch: triggered runs only.
    schedule = "@continuous" if cfg.mode == "stream" else None
    with _dag(
        cfg,
        "stream",
        schedule=schedule,
        params=params,
        description=f"Micro-batches of {cfg.name} in one Spark session, for a bounded time per run",
    ) as dag:
        OffsetlakeOperator(
            task_id="stream",
            pipeline=cfg.name,
            command="stream",
            arguments=["--max-seconds", "{{ params.max_seconds | int }}"],
            **retry_policy(cfg, "stream"),
        )
    return dag


def backfill_dag(cfg: PipelineConfig) -> DAG:
    range_item = {
        "type": "object",
        "additionalProperties": False,
        "required": ["topic", "partition", "start", "end"],
        "properties": {
            "topic": _topic_field(cfg),
            "partition": {"type": "integer", "minimum": 0},
            "start": {"type": "integer", "minimum": 0},
            "end": {"type": "integer", "minimum": 1},
        },
    }
    params = {
        "pipeline": Param(cfg.name, type="string", enum=[cfg.name], description="the pipeline this DAG runs"),
        **_table_param(cfg, "the table whose ranges these are"),
        "ranges": Param(
            [],
            type="array",
            items=range_item,
            description='offset ranges, end exclusive: [{"topic": "t", "partition": 0, "start": 0, "end": 100}]',
        ),
        "time_from": Param(
            None,
            type=["null", "string"],
            format="date-time",
            description="or a time window start (ISO 8601), resolved with offsets_for_times",
        ),
        "time_to": Param(None, type=["null", "string"], format="date-time", description="time window end"),
        "dry_run": Param(False, type="boolean", description="show the plan and change nothing"),
    }
    with _dag(
        cfg,
        "backfill",
        schedule=None,
        params=params,
        description=f"Re-read offset ranges of {cfg.name} and replace their rows in one commit",
    ) as dag:

        @task(task_id="validate")
        def validate(params) -> str:
            from offsetlake.airflow.forms import backfill_ranges

            return backfill_ranges(cfg, dict(params))

        ranges = validate()  # type: ignore[call-arg]  # Airflow's @task: a call makes the task
        spark_step(
            cfg,
            "backfill",
            "backfill",
            arguments=[
                "--ranges",
                "{{ ti.xcom_pull(task_ids='validate') }}",
                "--dry-run",
                "{{ 'true' if params.dry_run else 'false' }}",
            ],
            after=ranges,
            one_table=True,
        )
    return dag


def recovery_dag(cfg: PipelineConfig) -> DAG:
    offset_item = {
        "type": "object",
        "additionalProperties": False,
        "required": ["topic", "partition", "offset"],
        "properties": {
            "topic": _topic_field(cfg),
            "partition": {"type": "integer", "minimum": 0},
            "offset": {"type": "integer", "minimum": 0},
        },
    }
    params = {
        "pipeline": Param(cfg.name, type="string", enum=[cfg.name]),
        **_table_param(cfg, "the table to audit (empty: every table); needed for reset"),
        "repair": Param(False, type="boolean", description="backfill what the audit finds"),
        "cleanup": Param(False, type="boolean", description="delete files no commit references"),
        "cleanup_older_than_seconds": Param(3600, type="integer", minimum=60),
        "reset": Param(False, type="boolean", description="move the ledger to reset_offsets (operators only)"),
        "reset_offsets": Param([], type="array", items=offset_item),
        "reset_reason": Param("", type="string", maxLength=500),
    }
    with _dag(
        cfg,
        "recovery",
        schedule="@daily",
        params=params,
        description=f"Audit {cfg.name} against Kafka; repair, clean up or reset when asked",
    ) as dag:
        validated_step(
            cfg,
            "recovery_args",
            "recovery",
            "recover",
            {
                "--repair": "repair",
                "--cleanup": "cleanup",
                "--older-than": "older_than",
                "--reset-offsets": "reset_offsets",
                "--reason": "reason",
            },
        )
    return dag


def validated_step(cfg: PipelineConfig, form: str, task_id: str, command: str, flags: dict[str, str]) -> None:
    """A `validate` task running `forms.<form>` on the trigger form, then the Spark step, whose arguments are
    the flags with the values `validate` normalised (pulled from its XCom): nothing typed reaches it raw."""

    @task(task_id="validate")
    def validate(params) -> dict:
        from offsetlake.airflow import forms

        return getattr(forms, form)(cfg, dict(params))

    pull = "{{{{ ti.xcom_pull(task_ids='validate')['{}'] }}}}".format
    arguments = [item for flag, key in flags.items() for item in (flag, pull(key))]
    spark_step(cfg, task_id, command, arguments, after=validate())  # type: ignore[call-arg]  # a call makes the task


def spark_step(
    cfg: PipelineConfig,
    task_id: str,
    command: str,
    arguments: list[str] | None = None,
    after=None,
    one_table: bool = False,
) -> None:
    """The DAG's Spark step, after `after` (a task) if given. A pipeline with a table per topic gets a
    `tables` task (the form's `table`, or every table now; `one_table`: the form must name one) and the
    step mapped over its list, each task labelled with its table."""
    settings = {"pipeline": cfg.name, "command": command, "arguments": arguments or [], **retry_policy(cfg, command)}
    if not per_topic(cfg):
        step = OffsetlakeOperator(task_id=task_id, **settings)
        if after is not None:
            after >> step
        return

    @task(task_id="tables")
    def tables(params=None) -> list[str]:
        from offsetlake.airflow.forms import form_tables
        from offsetlake.config.connections import resolve_connections

        return form_tables(resolve_connections(cfg), dict(params or {}), one=one_table)

    names = tables()  # Airflow's @task: a call makes the task
    if after is not None:
        after >> names
    OffsetlakeOperator.partial(task_id=task_id, map_index_template="{{ task.table }}", **settings).expand(table=names)


def _table_param(cfg: PipelineConfig, description: str) -> dict[str, Param]:
    """The form's `table` field, for a pipeline with a table per topic (the tables are known only at run
    time: the `tables` task checks the name)."""
    if not per_topic(cfg):
        return {}
    return {"table": Param("", type="string", maxLength=249, description=description)}


def _topic_field(cfg: PipelineConfig) -> dict:
    """A form's topic: one of the pipeline's topics, or any name when they are patterns (checked by the
    validate task against the cluster)."""
    if any(is_pattern(t) for t in cfg.topics):
        return {"type": "string", "minLength": 1, "maxLength": 249}
    return {"type": "string", "enum": list(cfg.topics)}


def maintenance_dag(cfg: PipelineConfig) -> DAG:
    settings = cfg.maintenance
    columns = cfg.data_columns()
    params = {
        "pipeline": Param(cfg.name, type="string", enum=[cfg.name]),
        **_table_param(cfg, "the table to maintain (empty: every table)"),
        "optimize": Param(True, type="boolean", description="compact small files (dataChange=false)"),
        "target_file_mb": Param(settings.target_file_mb, type="integer", minimum=1, maximum=4096),
        "zorder_by": Param(
            list(settings.zorder_by),
            type="array",
            items={"type": "string"} if cfg.format.evolves else {"type": "string", "enum": columns},
            description="columns each compacted file is sorted by along a Z-order curve",
        ),
        "vacuum": Param(True, type="boolean", description="delete files removed longer ago than the retention"),
        "vacuum_retention_hours": Param(
            settings.deleted_file_retention_hours,
            type="integer",
            minimum=1,
            description="time travel and RESTORE keep working this far back",
        ),
        "checkpoint": Param(True, type="boolean", description="Delta checkpoint, then log clean-up"),
    }
    with _dag(
        cfg,
        "maintenance",
        schedule="@daily",
        params=params,
        description=f"Optimize, vacuum and checkpoint {cfg.table_path} and its quarantine",
    ) as dag:
        validated_step(
            cfg,
            "maintenance_args",
            "maintenance",
            "maintain",
            {
                "--optimize": "optimize",
                "--vacuum": "vacuum",
                "--checkpoint": "checkpoint",
                "--retention-hours": "retention_hours",
                "--target-file-mb": "target_file_mb",
                "--zorder-by": "zorder_by",
            },
        )
    return dag


def pipeline_dags(cfg: PipelineConfig) -> list[DAG]:
    return [ingest_dag(cfg), stream_dag(cfg), backfill_dag(cfg), recovery_dag(cfg), maintenance_dag(cfg)]


def build_dags(directory: str | Path | None = None) -> dict[str, DAG]:
    """Every pipeline's DAGs, by DAG id: for each file in `include/pipelines/` (or `directory`) its ingest,
    stream, backfill, recovery and maintenance DAGs. A DAG file needs only

    ```python
    from offsetlake.airflow.dags import build_dags

    globals().update(build_dags())
    ```
    """
    dags: dict[str, DAG] = {}
    for name in list_pipelines(directory):
        for dag in pipeline_dags(load_pipeline(name, directory)):
            dags[dag.dag_id] = dag
    return dags

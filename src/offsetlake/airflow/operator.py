"""`OffsetlakeOperator`: one offsetlake command, for one pipeline, as a Spark application.

It is a `SparkSubmitOperator` (apache-airflow-providers-apache-spark) that knows
which job to submit and how to read back what the job committed:

- the Spark master and deploy mode come from the connection (`spark_default`);
- the driver binds to loopback only when that master is `local[...]`: on a
  cluster, executors must reach the driver, whose address is then Spark's own
  choice on the worker (SPARK_LOCAL_IP, else the host name);
- the job file, the pipeline folder and the Python interpreter are resolved on
  the worker that runs the task, when it runs it: nothing machine-specific is
  baked into the DAG;
- every commit the job makes records this task try (dag id, run id, try number)
  in its `userMetadata`; `execute` reads those commits back from the table's
  history and returns them (a retry returns those of every try of its run), so
  other tasks get the result by XCom on any worker;
- an ingest with nothing new to read submits no Spark job (the check reads the ledger
  and Kafka's end offsets in the task process): no JVM starts for nothing;
- OpenLineage: the provider's listener asks `get_openlineage_facets_on_complete`
  for the run's datasets: the pipeline's Kafka topics in, its Delta table out,
  with the version the task committed (`offsetlake.operations.lineage`);
- a failed try is retried (`RETRIES`, with exponential backoff): every command is
  safe to run again, since the ledger turns a re-run of a committed batch into a
  no-op. That is what carries a pipeline across a Kafka outage longer than
  `kafka.retry_seconds`, a lost driver or a killed worker.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from offsetlake.config import project_home
from offsetlake.spark.session import spark_conf

if TYPE_CHECKING:
    from offsetlake.config import PipelineConfig

# Commit timestamps come from the writer's clock (the Spark driver's host): read back a little earlier.
CLOCK_SKEW_MS = 5 * 60 * 1000
# command -> jobs/<file>.py; each job file runs `offsetlake <command>`.
JOBS = {
    "ingest": "ingest",
    "stream": "stream",
    "backfill": "backfill",
    "recover": "recovery",
    "maintain": "maintenance",
}
RETRIES = {"ingest": 3, "stream": 5, "backfill": 0, "recover": 0, "maintain": 1}
"""Tries after the first, per command; `retries=` given to the operator wins. Ingest and stream are what a
schedule relies on. A backfill is refused for reasons a retry does not change (a range past the ledger,
below the log start) and someone is watching it; `recover` fails when the audit finds damage, which running
it again finds again: neither is retried."""
RETRY_DELAY = dt.timedelta(seconds=30)
MAX_RETRY_DELAY = dt.timedelta(minutes=10)


class OffsetlakeOperator(SparkSubmitOperator):
    """Run `offsetlake <command> --pipeline <pipeline> [--table <table>] <arguments>` through spark-submit.

    ``on_kill`` is SparkSubmitOperator's: it goes to the hook, which stops spark-submit
    (or the driver on the cluster). A killed job commits nothing it had not committed.

    :param pipeline: the pipeline's name (``include/pipelines/<pipeline>.yaml``). (templated)
    :param table: one table of a pipeline that writes a table per topic (its ``table.path`` holds
        ``{table}`` or ``{topic}``); the DAGs map one task per table with ``.expand(table=...)``.
        None: the pipeline's one table (or, for ``ingest`` and ``stream``, all of them). (templated)
    :param command: ``ingest``, ``stream``, ``backfill``, ``recover`` or ``maintain``.
    :param arguments: further arguments of that command, e.g. ``["--ranges", "t:0:0-100"]``;
        pass only what a validation task has normalised. (templated)
    :param conn_id: the Spark connection: master (``local[*]``, ``spark://host:7077``, ``yarn``,
        ``k8s://...``) and, in its extra, ``deploy-mode``.
    :param kwargs: anything ``SparkSubmitOperator`` takes (``conf``, ``executor_memory``, ...);
        ``conf`` given here wins over offsetlake's settings, and ``retries``, ``retry_delay``,
        ``retry_exponential_backoff``, ``max_retry_delay`` over the defaults (``RETRIES``).
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "pipeline", "table", "arguments")
    """SparkSubmitOperator's templated fields, and `pipeline`, `table` and `arguments`."""

    def __init__(
        self,
        *,
        pipeline: str,
        command: str,
        table: str | None = None,
        arguments: Sequence[str] = (),
        conn_id: str = "spark_default",
        **kwargs: Any,
    ) -> None:
        if command not in JOBS:
            raise ValueError(f"unknown offsetlake command {command!r}: one of {', '.join(JOBS)}")
        kwargs.setdefault("name", f"offsetlake-{command}-{pipeline}")
        kwargs.setdefault("retries", RETRIES[command])
        kwargs.setdefault("retry_delay", RETRY_DELAY)
        kwargs.setdefault("retry_exponential_backoff", True)
        kwargs.setdefault("max_retry_delay", MAX_RETRY_DELAY)
        super().__init__(conn_id=conn_id, **kwargs)
        self.pipeline = pipeline
        self.table = table
        self.command = command
        self.arguments = list(arguments)

    def execute(self, context) -> dict:  # type: ignore[override]  # the commits, as XCom (BaseOperator's is Any)
        """Submit the command's job, then return what this task try committed (its XCom).

        An `ingest` first compares the ledger with Kafka's end offsets in the task's own process: with
        nothing new to read it submits no Spark job. The commits are read back from the table's history by
        dag id, run id and try number (a retry: those of every try of its run).

        :returns: `{"versions", "kinds", "rows", "ranges", "submitted"}`; for a stream over every table of
            a per-topic pipeline, `{"pipeline", "submitted"}`.
        """
        ti = context["ti"]
        self.application = str(project_home() / "jobs" / f"{JOBS[self.command]}.py")
        self.application_args = [
            "--pipeline",
            self.pipeline,
            "--dag-id",
            ti.dag_id,
            "--run-id",
            ti.run_id,
            "--try-number",
            str(ti.try_number),
            *(["--table", self.table] if self.table else []),
            *self.arguments,
        ]
        self.conf = {**spark_conf(self._master()), **(self.conf or {})}
        started = dt.datetime.now(dt.UTC)
        from offsetlake.config import load_pipeline
        from offsetlake.config.connections import read_connections, resolve_connections
        from offsetlake.config.topic_tables import only_table, per_topic
        from offsetlake.kafka import topic_lister

        cfg = load_pipeline(self.pipeline)
        connections = read_connections(cfg)  # once, here: through Airflow's API and its secrets backends
        cfg = resolve_connections(cfg, connections)  # this process reads the table too (table.connection)
        if self.table or not per_topic(cfg):
            # the table this task reads back (and checks is up to date)
            cfg = only_table(cfg, self.table, topic_lister(cfg.kafka))
        else:  # every table of a per-topic pipeline, in one job (a stream): nothing to read back here
            self._cfg = None
            with self._handed_to_the_job(connections):
                super().execute(context)
            return {"pipeline": cfg.name, "submitted": True}
        self._cfg = cfg
        submitted = not self._up_to_date(cfg)
        if submitted:
            with self._handed_to_the_job(connections):
                super().execute(context)
        from offsetlake.operations.status import (
            commits_of_task_try,  # reads Delta: only in the process that runs the task
        )

        # A retry reports what every try of this run committed: a failed try may have committed batches.
        retried = ti.try_number > 1
        run_started = getattr(context.get("dag_run"), "start_date", None)
        since = int(((run_started or started) if retried else started).timestamp() * 1000) - CLOCK_SKEW_MS
        result = commits_of_task_try(cfg, ti.dag_id, ti.run_id, None if retried else ti.try_number, since)
        self._committed = result
        return {**result, "submitted": submitted}

    def get_openlineage_facets_on_complete(self, task_instance):
        """OpenLineage (the provider calls this after `execute`): the Kafka topics in, the Delta table out,
        with the newest version this task committed and the rows it added."""
        from airflow.providers.openlineage.extractors import OperatorLineage

        from offsetlake.config import load_pipeline
        from offsetlake.config.topic_tables import per_topic
        from offsetlake.operations.lineage import pipeline_datasets

        cfg = getattr(self, "_cfg", None) or load_pipeline(self.pipeline)
        if per_topic(cfg):  # every table of a per-topic pipeline in one job: no one table to name
            return OperatorLineage()
        inputs, output = pipeline_datasets(cfg, getattr(self, "_committed", None))
        return OperatorLineage(inputs=inputs, outputs=[output])

    @contextlib.contextmanager
    def _handed_to_the_job(self, connections: dict[str, dict]):
        """The pipeline's Airflow connections (read where the task runs) handed to the job as a file only this
        user can read, named by an environment variable of spark-submit; deleted when spark-submit ends
        (offsetlake.config.connections)."""
        if not connections:
            yield
            return
        from offsetlake.config.connections import CONNECTIONS_FILE_ENV, write_connections_file

        directory = Path(tempfile.mkdtemp(prefix="offsetlake-connections-"))  # 0700
        previous = self.env_vars
        try:
            path = write_connections_file(directory, connections)
            self.env_vars = {**(previous or {}), CONNECTIONS_FILE_ENV: str(path)}
            self.log.info("Airflow connections %s handed to the job in a private file", ", ".join(connections))
            yield
        finally:
            self.env_vars = previous
            shutil.rmtree(directory, ignore_errors=True)

    def _up_to_date(self, cfg: PipelineConfig) -> bool:
        """An ingest with nothing new to read submits no Spark job: it answers in a second or two
        instead of a JVM's start. Anything unclear (no table yet, Kafka unreachable) goes to the job,
        which decides and words the error (and Airflow retries it)."""
        if self.command != "ingest":
            return False
        from offsetlake.batch import nothing_to_ingest  # Kafka and Delta: only in the process that runs the task

        try:
            # Asked once, without kafka.retry_seconds of retries: in an outage the job retries, not this check too.
            once = cfg.model_copy(update={"kafka": cfg.kafka.model_copy(update={"retry_seconds": 0})})
            if nothing_to_ingest(once):
                self.log.info("%s is up to date: nothing new to ingest, no Spark job submitted", self.pipeline)
                return True
        except Exception as err:  # noqa: BLE001 - the job itself reports it
            self.log.info("could not tell whether %s is up to date (%s): submitting the job", self.pipeline, err)
        return False

    def _master(self) -> str:
        """The connection's master, as the Spark provider reads it (it defaults to yarn)."""
        from airflow.sdk import BaseHook

        try:
            conn = BaseHook.get_connection(self._conn_id)
        except Exception:  # the provider falls back to yarn: not local
            return "yarn"
        return conn.host or ""

"""How a pipeline is operated, beside what it ingests: how Airflow retries its steps (`airflow`) and when the
alert rules offsetlake ships page someone about it (`alerts`). Read by the DAG factory and the metrics
endpoint; a batch never reads them."""

from __future__ import annotations

from pydantic import Field, StrictFloat, StrictInt

from offsetlake.config.strict import Strict

MIN_STALL_SECONDS = 300  # a stream's batch of a large backlog may take minutes: never call that a stall


class AirflowSettings(Strict):
    """How Airflow retries the pipeline's ingest, stream and maintenance steps (backfill and recovery
    are never retried: what fails them, a retry meets again). See docs/concepts/faults.md."""

    retries: StrictInt | None = Field(default=None, ge=0, le=100)
    """How often Airflow retries a failed step. None: the step's own (ingest 3, stream 5, maintenance 1)."""
    retry_delay_seconds: StrictInt = Field(default=30, gt=0)
    """The first wait before a retry; it doubles, up to 10 minutes."""


class AlertSettings(Strict):
    """The pipeline's thresholds for the Prometheus alert rules `offsetlake monitoring rules` prints: the
    metrics endpoint gives each one as a gauge labelled with the pipeline, so one rule serves every pipeline."""

    max_lag_records: StrictInt | None = Field(default=None, gt=0)
    """`OffsetlakeLagHigh` fires when the pipeline's lag (records in Kafka not yet in the table) stays above
    this for 15 minutes. None: never, for this pipeline."""
    max_quarantine_share: StrictFloat = Field(default=0.01, gt=0, le=1)
    """`OffsetlakeQuarantineHigh` fires when more than this share of the records ingested over 15 minutes
    went to the quarantine table."""
    stalled_stream_intervals: StrictInt = Field(default=10, gt=0)
    """`OffsetlakeStreamStalled` fires when a stream (mode `stream`) leaves records waiting and commits
    nothing for this many `stream_interval_seconds`, and at least 5 minutes."""

    def stall_seconds(self, stream_interval_seconds: float) -> float:
        """How long a stream may go without a commit while records wait."""
        return max(self.stalled_stream_intervals * stream_interval_seconds, MIN_STALL_SECONDS)

"""The pipeline file's model: pydantic's validation (extra keys forbidden, strict types), so every mistake
names its key. A `PipelineConfig` is what the rest of offsetlake is given."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Literal, Self

from pydantic import (
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from offsetlake.config.columns import LINEAGE_COLUMNS, RAW_COLUMNS, UNKNOWN_FIELDS_COLUMN
from offsetlake.config.format_settings import RecordFormat
from offsetlake.config.operation_settings import AirflowSettings, AlertSettings
from offsetlake.config.strict import Strict, catalog_name, path_placeholders, redact_client
from offsetlake.errors import ConfigError
from offsetlake.storage.location import S3_SCHEMES, Location

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$"
# Settings offsetlake owns: a pipeline may not override them, because the batch protocol depends on them.
RESERVED_CLIENT_KEYS = {
    "bootstrap.servers",
    "group.id",
    "isolation.level",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "enable.partition.eof",
    "transactional.id",
}


class KafkaSettings(Strict):
    bootstrap_servers: StrictStr | None = None
    """The brokers, `host:port,...`. Required unless `kafka.connection`'s extra has `bootstrap.servers`."""
    connection: StrictStr | None = None
    """An Airflow connection (the Apache Kafka provider's type, conn_type `kafka`) whose extra holds librdkafka
    settings (`bootstrap.servers`, `security.protocol`, `sasl.*`, `ssl.*`). Read through Airflow's API where
    the Airflow task runs, so secrets backends work; handed to the job in a private file, never on a command
    line. Its extra's protocol keys (`group.id`...) are ignored; `kafka.client` wins over it. The CLI uses
    `${ENV}` references instead."""
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    """`read_committed`: batches end at the last stable offset and aborted records never reach the table."""
    client: dict[StrictStr, StrictStr | StrictInt | StrictBool] = Field(default_factory=dict)
    """Extra librdkafka settings for every client offsetlake creates (SASL/SSL...). Settings the batch
    protocol owns (`group.id`, `isolation.level`, `auto.offset.reset`...) are refused. Unless set here,
    `reconnect.backoff.ms` is 10 (librdkafka's default, 100, held each new client's first request back 50 ms)."""
    timeout_seconds: StrictInt = Field(default=30, gt=0)
    """Broker request timeout."""
    retry_seconds: StrictInt = Field(default=120, ge=0)
    """How long a retriable Kafka error (a broker restarting, a leader or epoch change, a coordinator loading,
    a timeout) is retried, waiting 0.5 s, 1 s, 2 s... up to 10 s between tries, each retry logged once; in
    planning, in the readers inside Spark tasks and in the consumer-group mirror. Unknown topics,
    authentication and authorization failures fail at once. `0`: never retry."""

    @model_validator(mode="after")
    def _no_reserved_keys(self) -> Self:
        clash = sorted(RESERVED_CLIENT_KEYS & set(self.client))
        if clash:
            raise ValueError(f"client setting {clash[0]!r} is managed by offsetlake and cannot be set")
        if self.bootstrap_servers is None and self.connection is None:
            raise ValueError("give 'bootstrap_servers', or an Airflow 'connection' whose extra holds bootstrap.servers")
        return self

    def client_config(self) -> dict[str, Any]:
        """librdkafka settings shared by every client the platform creates."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.client}

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for key, value in super().__repr_args__():
            yield key, (redact_client(value) if key == "client" else value)


# A commit is safe only if the store writes the next log entry only when it is absent. On S3 that is
# S3's conditional writes (If-None-Match); without them two writers racing for a version can both
# "succeed" and one commit is lost. So an s3:// table must say it has them. deltalake 1.6.6 happens to send
# If-None-Match by default, but its maintainers call that accidental (delta-io/delta-rs#4464): the setting
# keeps the safety from resting on a default. delta-rs' DynamoDB lock, the other way, is gone from it:
# with `AWS_S3_LOCKING_PROVIDER: dynamodb` it commits without the lock (docs/development/measurements.md),
# so that setting is refused, not trusted.
PUT_IF_ABSENT = {"conditional_put": "etag", "aws_conditional_put": "etag"}


class TableSettings(Strict):
    path: StrictStr
    """The Delta table's location: a local path (relative to the project) or an object-store URI
    (`s3://bucket/prefix`; delta-rs' other schemes by the same keys, untested). `{table}` (the topic's
    last dot-separated segment) or `{topic}` in it gives each topic a table (and a ledger) of its own:
    `lake/shop/{table}`."""

    @field_validator("path")
    @classmethod
    def _known_placeholders(cls, path: str) -> str:
        try:
            fields = path_placeholders(path)
        except ValueError:
            fields = None
        if fields is None or "{{" in path or "}}" in path:
            raise ValueError(f"{path!r}: braces are only for the placeholders {{table}} and {{topic}}")
        unknown = sorted(fields - {"table", "topic"})
        if unknown:
            raise ValueError(f"{path!r}: unknown placeholder {{{unknown[0]}}}: use {{table}} or {{topic}}")
        return path

    partition_by: list[StrictStr] = Field(default_factory=list)
    """Partition columns (columns of the table)."""
    name: StrictStr | None = None
    """The table's name in the Spark session's catalog, `schema.table` (`lake.orders`; `{table}` as in `path`),
    registered by the first run that finds it unregistered, its schema and properties there refreshed by each
    batch. The session needs that catalog and delta-spark: docs/how-to/catalog.md."""
    _two_part_name = field_validator("name")(catalog_name)

    engine: Literal["delta-rs", "delta-spark"] = "delta-rs"
    """What commits the batches: `delta-rs` (offsetlake's own writer, no JVM work on the driver) or
    `delta-spark` (Delta's Spark engine in the job's Spark session, which writes every table feature Spark
    and Databricks turn on: liquid clustering, row tracking, in-commit timestamps, identity columns...).
    The ledger is the same, so a table may change engine between runs."""
    storage_options: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    """delta-rs/object_store settings for every reader and writer of this table: `AWS_ENDPOINT_URL`,
    `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (as `${ENV}` references; never printed),
    `AWS_ALLOW_HTTP`. An `s3://` table needs put-if-absent commits: `conditional_put: etag` (S3's
    conditional writes; AWS S3 and most compatible stores have them). The DynamoDB lock is refused:
    delta-rs 1.x no longer has it."""
    connection: StrictStr | None = None
    """An Airflow connection of the amazon provider's type `aws` (e.g. `aws_default`) to take the credentials
    from, resolved where the task runs: login and password as the access key and secret, extra
    `region_name`, `endpoint_url` and `aws_session_token`. Keys given in `storage_options` win."""
    retry_seconds: StrictInt = Field(default=120, ge=0)
    """How long a retriable object-store error (503 SlowDown, a timeout, an endpoint restarting) is retried,
    with backoff, by every reader and writer of the table (delta-rs' `retry_timeout`, and the executors'
    Parquet writes); past it the job fails in one line and nothing is half-written. Local tables ignore it."""

    @model_validator(mode="after")
    def _safe_commits_on_s3(self) -> Self:
        if self.path.startswith(S3_SCHEMES):
            given = {k.lower(): v.lower() for k, v in self.storage_options.items()}
            if "aws_s3_locking_provider" in given:
                raise ValueError(
                    f"table {self.path!r}: AWS_S3_LOCKING_PROVIDER (the DynamoDB lock) is not supported by "
                    f"delta-rs 1.x, which would write without it; use conditional_put: etag (S3 conditional "
                    f"writes) instead"
                )
            if not any(given.get(key) == value for key, value in PUT_IF_ABSENT.items()):
                raise ValueError(
                    f"table {self.path!r} is on S3 but its storage_options give no put-if-absent commit: set "
                    f"conditional_put: etag (S3 conditional writes); without it, two writers can both commit "
                    f"the same version and one is lost"
                )
        return self

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for key, value in super().__repr_args__():
            yield key, (redact_client(value) if key == "storage_options" else value)


class BatchSettings(Strict):
    max_records_per_batch: StrictInt = Field(default=1_000_000, gt=0)
    """Offset span of one batch (one Delta commit)."""
    max_records_per_task: StrictInt = Field(default=250_000, gt=0)
    """Offset span of one task (one partition slice; a local master's Spark task per core runs several in order,
    fetching the next while writing the last), converted and written 50,000 records at a time."""
    read_timeout_seconds: StrictInt = Field(default=60, gt=0)
    """A task that makes no progress this long fails."""
    tables_at_once: StrictInt = Field(default=4, gt=0)
    """With a table per topic: how many of the pipeline's tables a run (or a stream's round) works on at
    once in its Spark session, so that their Spark jobs share its cores. Each table still commits and
    fails on its own. 1 takes the tables one after another."""
    driver_reads_up_to: StrictInt = Field(default=0, ge=0)
    """A batch of at most this many offsets is read and staged by the Spark driver, not a Spark job (which a
    stream of small batches waits on every round); the files and commit are the same. 0: always a job."""


class WriteSettings(Strict):
    """How a batch changes the table. See docs/concepts/write-modes.md."""

    mode: Literal["append", "upsert"] = "append"
    """`append`: every record is a new row. `upsert`: the table holds the latest row per `key`; a batch is
    one Delta MERGE committed with its offsets, the record with the highest offset per key winning."""
    key: list[StrictStr] = Field(default_factory=list)
    """Upsert only: the columns that identify a row (payload columns, `kafka_key` or raw's `key`). With a
    table per topic, every table's, but those named in `keys`."""
    keys: dict[StrictStr, list[StrictStr]] = Field(default_factory=dict)
    """Upsert with a table per topic (`table.path` holding `{table}` or `{topic}`): the key of each table
    named here (by its name, as `--table` takes it); the others take `key`. For a database whose tables'
    primary keys differ: `{order_lines: [order_id, line_no]}`."""
    order_by: StrictStr | None = None
    """Upsert only: a column (an event time, a source LSN) whose greatest value wins, within a batch and
    across batches, so that one key may arrive in several partitions. Without it a key must keep to one
    partition (Kafka's default partitioner does); a batch holding a key in two partitions fails, naming
    it: the order of two partitions is not Kafka's to give. A record whose order_by is null is
    quarantined."""
    deletes: Literal["tombstone", "ignore"] = "tombstone"
    """Upsert only: a record whose value is null (a tombstone) deletes its key (`tombstone`), or is
    skipped (`ignore`). A tombstone has no order_by value: with order_by, deletes must be `ignore`. With
    `format.envelope: debezium` the delete is the `d` event, which has its position (order_by may be
    `_debezium_position`); `ignore` skips `d` events."""
    change_data_feed: StrictBool = True
    """Upsert only: the table is created with Delta's change data feed, so each MERGE records its inserts,
    updates and deletes for `table_changes` / `load_cdf`."""

    @model_validator(mode="after")
    def _key_for_upsert(self) -> Self:
        if self.mode == "upsert" and not self.key and not self.keys:
            raise ValueError("write.mode 'upsert' needs write.key: the columns that identify a row")
        if self.mode == "append" and (self.key or self.keys or self.order_by):
            raise ValueError("write.key, write.keys and write.order_by are for write.mode 'upsert'")
        if len(set(self.key)) != len(self.key):
            raise ValueError("write.key lists a column twice")
        for table, key in self.keys.items():
            if not key:
                raise ValueError(f"write.keys.{table} is empty: a key names at least one column")
            if len(set(key)) != len(key):
                raise ValueError(f"write.keys.{table} lists a column twice")
        return self

    def key_of(self, table: str | None) -> list[str]:
        """The key of a table of the pipeline (None: its only table)."""
        return self.keys.get(table, self.key) if table is not None else self.key

    @property
    def upsert(self) -> bool:
        return self.mode == "upsert"

    @property
    def required(self) -> list[str]:
        """The columns a row cannot be upserted without."""
        return [*self.key, *([self.order_by] if self.order_by else [])]


class MaintenanceSettings(Strict):
    """How the table stays cheap to read and to commit to, however old it gets. See docs/operations/maintenance.md."""

    checkpoint_interval: StrictInt = Field(default=10, gt=0)
    """Commits between Delta checkpoints (as Delta Spark)."""
    log_retention_days: StrictFloat = Field(default=30, ge=1 / 24)
    """Commit files older than this are removed; fractions allowed (0.25: six hours), at least an hour. Size
    it to a stream's rate (see Maintenance)."""
    deleted_file_retention_hours: StrictInt = Field(default=168, ge=1)
    """Removed data files are kept this long (time travel, RESTORE); vacuum deletes them after."""
    target_file_mb: StrictInt = Field(default=128, gt=0)
    """Compaction packs small files up to this size."""
    zorder_by: list[StrictStr] = Field(default_factory=list)
    """Compaction sorts each new file by these columns (Z-order)."""
    compact_every_batches: StrictInt = Field(default=50, ge=0)
    """A stream compacts what it wrote every this many batches; 0: never."""

    def table_properties(self) -> dict[str, str]:
        """Delta table properties of the tables offsetlake creates."""
        days = self.log_retention_days
        log_retention = (
            f"interval {int(days)} days" if days == int(days) else f"interval {round(days * 24 * 60)} minutes"
        )
        return {
            "delta.checkpointInterval": str(self.checkpoint_interval),
            "delta.logRetentionDuration": log_retention,
            "delta.enableExpiredLogCleanup": "true",
            "delta.deletedFileRetentionDuration": f"interval {self.deleted_file_retention_hours} hours",
        }

    def stream_window_warning(self, interval_seconds: float) -> str | None:
        """One line when a stream committing every `interval_seconds` would keep more commits in its log, or
        remove more files within the deleted-file retention, than a batch can afford to pay for.

        Every batch lists the commit files in `_delta_log` (on a local disk, each costs a few
        microseconds a batch) and every checkpoint carries the files removed within the deleted-file
        retention (its tombstones): the per-batch cost is bounded by these two windows, not by the
        table's age, but the windows must fit the commit rate (`make soak`; docs/operations/maintenance.md)."""
        per_day = 86_400 / interval_seconds
        commits, removed = self.log_retention_days * per_day, self.deleted_file_retention_hours / 24 * per_day
        if max(commits, removed) <= STREAM_WINDOW_BUDGET:
            return None
        return (
            f"a stream every {interval_seconds:g} s keeps ~{commits:,.0f} commits in its log "
            f"(maintenance.log_retention_days {self.log_retention_days:g}) and ~{removed:,.0f} removed files "
            f"in its checkpoints (maintenance.deleted_file_retention_hours {self.deleted_file_retention_hours}); "
            f"each batch pays for both: keep them under {STREAM_WINDOW_BUDGET:,} (docs/how-to/stream-retention.md)"
        )


# Commits in the log, or files removed within the retention, that a batch pays for cheaply
# (docs/development/measurements.md).
STREAM_WINDOW_BUDGET = 20_000


class PipelineConfig(Strict):
    name: StrictStr = Field(pattern=NAME_RE)
    """Must match the file name."""
    topics: list[StrictStr] = Field(min_length=1)
    """One or more topics, read into one table, or into a table each when `table.path` holds `{table}` or
    `{topic}`. An entry starting with `^` is a regex matched against the cluster's topics when a run starts
    (`^pg\\.shop\\..*`): a later topic that matches is read by the next run (a stream with none waits)."""

    @field_validator("topics")
    @classmethod
    def _valid_patterns(cls, topics: list[str]) -> list[str]:
        for topic in topics:
            if topic.startswith("^"):
                try:
                    re.compile(topic)
                except re.error as err:
                    raise ValueError(f"{topic!r} is not a valid regular expression: {err}") from err
        return topics

    kafka: KafkaSettings
    """The Kafka cluster, and how offsetlake's clients talk to it."""
    table: TableSettings
    """The Delta table the records go to."""
    format: RecordFormat
    """How a record becomes a row."""
    batch: BatchSettings = Field(default_factory=BatchSettings)
    """How a backlog is cut into batches and tasks."""
    write: WriteSettings = Field(default_factory=WriteSettings)
    """Append every record, or keep the latest row per key (upsert)."""
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    """First batch only. Partitions added later always start at their earliest offset."""
    on_data_loss: Literal["fail", "skip"] = "fail"
    """Offsets the ledger still needs were deleted from Kafka: `fail` (naming the range) or `skip` (recorded
    in the commit)."""
    mode: Literal["batch", "stream"] = "batch"
    """`batch`: the ingest DAG runs on `schedule`; `stream`: the stream DAG keeps one run going. The other DAG
    only runs when triggered (safe beside it: the ledger serialises them)."""
    schedule: StrictStr | None = "@hourly"
    """The ingest DAG's schedule in mode `batch`; null: triggered runs only. Refused in mode `stream`."""
    stream_interval_seconds: float = Field(default=5.0, gt=0)
    """The pause between a stream's batches."""
    quarantine: TableSettings | None = None
    """The Delta table for records that do not parse or fit. Default: `<table.path>_quarantine`."""
    maintenance: MaintenanceSettings = Field(default_factory=MaintenanceSettings)
    """Delta properties of the tables offsetlake creates, and compaction."""
    airflow: AirflowSettings = Field(default_factory=AirflowSettings)
    """How Airflow retries the pipeline's steps."""
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    """When the alert rules offsetlake ships fire for this pipeline."""
    description: StrictStr = ""
    """Shown on the pipeline's DAGs."""

    @model_validator(mode="after")
    def _partition_columns_exist(self) -> Self:
        columns = set(self.column_names())
        for col in self.table.partition_by:
            # Registry formats learn their payload columns from the registry: checked when the table is made.
            if col not in columns and not self.format.evolves:
                raise ValueError(f"table.partition_by column {col!r} is not a column of the table")
        for col in self.maintenance.zorder_by:
            if col not in self.data_columns() and not self.format.evolves:
                raise ValueError(f"maintenance.zorder_by column {col!r} is not a data column of the table")
        keys = [col for key in self.write.keys.values() for col in key]
        for col in [*self.write.key, *keys, *([self.write.order_by] if self.write.order_by else [])]:
            if col not in columns and not self.format.evolves:
                raise ValueError(f"write column {col!r} is not a column of the table")
        if self.write.keys and not path_placeholders(self.table.path):
            raise ValueError(
                "write.keys gives tables of a table per topic their keys; this pipeline writes one table "
                f"({self.table.path}): use write.key"
            )
        write = self.write
        if write.order_by and write.deletes == "tombstone" and write.upsert and not self.format.debezium_envelope:
            raise ValueError(
                "write.order_by with write.deletes 'tombstone': a tombstone has no value to order by; "
                "set write.deletes: ignore (a Debezium delete event has its position: envelope debezium orders it)"
            )
        if self.format.debezium_envelope and not self.write.upsert:
            raise ValueError(
                "format.envelope 'debezium' needs write.mode 'upsert' (a change stream's table is its source "
                "table's current state) with write.key naming the source table's key columns"
            )
        if set([*self.write.key, *keys]) & set(LINEAGE_COLUMNS):
            raise ValueError("write.key names a Kafka lineage column: a key is the record's own (kafka_key, say)")
        if len(set(self.topics)) != len(self.topics):
            raise ValueError("topics lists a topic twice")
        if self.quarantine is not None and bool(path_placeholders(self.table.path)) != bool(
            path_placeholders(self.quarantine.path)
        ):
            raise ValueError(
                "table.path and quarantine.path: both or neither hold {table}/{topic} (each table needs "
                "a quarantine table of its own)"
            )
        if self.mode == "stream" and "schedule" in self.model_fields_set and self.schedule is not None:
            raise ValueError(
                "schedule is the ingest DAG's, for mode 'batch'; in mode 'stream' the stream DAG "
                "runs all the time (leave schedule out)"
            )
        return self

    def column_names(self) -> list[str]:
        """The columns known from the pipeline file (registry formats: without the payload's)."""
        if self.format.type == "raw":
            payload = list(RAW_COLUMNS)
        else:
            payload = [f.name for f in self.format.schema_]
        if self.format.unknown_fields == "keep":
            payload.append(UNKNOWN_FIELDS_COLUMN)
        return [*payload, *self.format.extra_columns(), *LINEAGE_COLUMNS]

    def data_columns(self) -> list[str]:
        """The columns that are not partition columns: what optimize may z-order by."""
        return [c for c in self.column_names() if c not in self.table.partition_by]

    def refuse_in_upsert_mode(self, operation: str, why: str) -> None:
        """One line, before anything runs, for an operation not defined on an upsert table yet."""
        if self.write.upsert:
            raise ConfigError(f"pipeline {self.name} writes in upsert mode (write.mode): {operation} {why}")

    def table_properties(self) -> dict[str, str]:
        """The Delta properties of the pipeline's table when offsetlake creates it."""
        properties = self.maintenance.table_properties()
        if self.write.upsert and self.write.change_data_feed:
            properties["delta.enableChangeDataFeed"] = "true"
        return properties

    @property
    def table_path(self) -> str:
        return self.table.path

    @property
    def quarantine_path(self) -> str:
        return self.quarantine.path if self.quarantine else self.table.path.rstrip("/") + "_quarantine"

    @property
    def table_location(self) -> Location:
        """The table's URI with what every reader and writer of it is given (options, credentials)."""
        return Location.of(self.table_path, effective_storage_options(self.table))

    @property
    def quarantine_location(self) -> Location:
        """The quarantine table's; the default quarantine beside the table takes the table's options."""
        return Location.of(self.quarantine_path, effective_storage_options(self.quarantine or self.table))

    @property
    def consumer_group(self) -> str:
        return f"offsetlake.{self.name}"


def effective_storage_options(table: TableSettings) -> dict[str, str]:
    """What every reader and writer of an object-store table is given: the pipeline's storage options, with
    `retry_seconds` as delta-rs' retry bound (object_store stops after 10 retries, ~3 s, by default: too
    short for a store that answers 503 SlowDown for a while). Local tables get none."""
    if not Location.of(table.path).is_object_store:
        return dict(table.storage_options)
    given = {k.lower() for k in table.storage_options}
    retry = {"retry_timeout": f"{table.retry_seconds}s", "max_retries": str(max(table.retry_seconds, 1) * 4)}
    return {**{k: v for k, v in retry.items() if k not in given}, **table.storage_options}

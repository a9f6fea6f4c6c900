"""Pipeline configuration: one YAML file per pipeline under include/pipelines/.

Validation is pydantic's (extra keys forbidden, strict types) so every mistake
names its key; errors are flattened to one line because they reach a terminal
or an Airflow task log. `${VAR}` / `${VAR:-default}` references are resolved
from the environment at load time so secrets never live in the file.
"""

from __future__ import annotations

import os
import re
import string
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from offsetlake import files
from offsetlake.errors import ConfigError
from offsetlake.formats.values import decimal_type

ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$"
# Client settings whose values must never be printed.
SECRET_HINTS = ("password", "secret", "token", "sasl.oauthbearer.config", "ssl.key.pem", "credentials")
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
FIELD_TYPES = ("string", "long", "int", "double", "float", "boolean", "timestamp", "date", "binary")
LINEAGE_COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp")
RAW_COLUMNS = ("key", "value")
KEY_COLUMN = "kafka_key"  # format.key: the decoded Kafka key (formats other than raw)
HEADERS_COLUMN = "kafka_headers"  # format.include_headers: map<string, binary>, every header in order
# Formats in the Confluent wire format (magic byte 0, 4-byte schema id, payload): the table's payload
# columns come from the registry and grow when a record arrives with a newer schema (docs/usage/registry-formats.md).
REGISTRY_FORMATS = ("avro", "protobuf", "json_schema")
# Upsert mode: true on a row that deletes its key (a tombstone). Only in the batch's staging files, never
# in the table: the MERGE reads it.
DELETED_COLUMN = "_offsetlake_deleted"
# Debezium upserts: the old key a primary-key change's create event names (its `__debezium.oldkey` header, as
# the header's bytes; null on every other event). Only in the staging files, like DELETED_COLUMN: the driver
# takes the values the create lacks from the old key's row (protocol/upsert.py, carry_across_key_changes).
OLD_KEY_COLUMN = "_offsetlake_old_key"
STAGING_COLUMNS = (DELETED_COLUMN, OLD_KEY_COLUMN)
# format.envelope debezium: the event's `op` (c, r, u, d) and its position in the source's log.
DEBEZIUM_OP_COLUMN = "_debezium_op"
DEBEZIUM_POSITION_COLUMN = "_debezium_position"
DEBEZIUM_COLUMNS = (DEBEZIUM_OP_COLUMN, DEBEZIUM_POSITION_COLUMN)
UNKNOWN_FIELDS_COLUMN = "_unknown_fields"  # unknown_fields: keep -> JSON text of the undeclared fields
DEFAULT_MAX_VALUE_BYTES = 1_048_576  # Kafka's own default message size limit


class _Strict(BaseModel):
    # A field's docstring is its description: in `offsetlake schema` and the generated pipeline reference.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class KafkaSettings(_Strict):
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
    def _no_reserved_keys(self):
        clash = sorted(RESERVED_CLIENT_KEYS & set(self.client))
        if clash:
            raise ValueError(f"client setting {clash[0]!r} is managed by offsetlake and cannot be set")
        if self.bootstrap_servers is None and self.connection is None:
            raise ValueError("give 'bootstrap_servers', or an Airflow 'connection' whose extra holds bootstrap.servers")
        return self

    def client_config(self) -> dict[str, Any]:
        """librdkafka settings shared by every client the platform creates."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.client}

    def __repr_args__(self):
        for key, value in super().__repr_args__():
            yield key, (redact_client(value) if key == "client" else value)


class SchemaField(_Strict):
    """One declared field of a `json` value or key."""

    name: StrictStr = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The JSON field, and the column it becomes."""
    type: StrictStr
    """One of `string`, `long`, `int`, `double`, `float`, `boolean`, `timestamp`, `date`, `binary`, or
    `decimal(p,s)` (precision 1 to 38). `timestamp`: RFC 3339 text (naive means UTC) or epoch milliseconds;
    `date`: `YYYY-MM-DD`; `binary`: base64 text; `decimal(p,s)`: decimal text (exact) or a JSON number (a
    double), never rounded: more decimal places than `s` is refused (with `format.envelope: debezium`, see
    `format.debezium.decimal_handling_mode`). No silent conversion between strings and numbers."""
    required: StrictBool = False
    """A record without it (or with null) is quarantined."""

    @field_validator("type")
    @classmethod
    def _known_type(cls, type_: str) -> str:
        type_ = type_.replace(" ", "")  # `decimal(10, 2)` as written in SQL
        declared = decimal_type(type_)
        if declared is not None:
            precision, scale = declared
            if not 1 <= precision <= 38 or scale > precision:
                raise ValueError(f"type {type_!r}: precision is 1 to 38, and scale 0 to the precision")
        elif type_ not in FIELD_TYPES:
            raise ValueError(f"type {type_!r} is not one of {', '.join(FIELD_TYPES)}, decimal(p,s)")
        return type_


class RegistrySettings(_Strict):
    """A Confluent-compatible Schema Registry (Confluent, Karapace, Apicurio's ccompat API)."""

    url: StrictStr | None = Field(default=None, pattern=r"^https?://")
    """The registry's URL. Required unless `connection` gives it."""
    connection: StrictStr | None = None
    """An Airflow HTTP connection: its host (a URL, or host with schema and port) gives the URL when `url` is
    not set, its login and password the basic auth. Read where the Airflow task runs."""
    username: SecretStr | None = None
    """Basic auth user, as a `${ENV}` reference; never printed nor logged."""
    password: SecretStr | None = None
    """Basic auth password, as a `${ENV}` reference; never printed nor logged."""
    subject_name_strategy: Literal["topic", "record", "topic_record"] = "topic"
    """Which subject a new table takes its schema from: `topic` (`<topic>-value`), `record`
    (`<record_name>`), `topic_record` (`<topic>-<record_name>`): Confluent's three strategies."""
    record_name: StrictStr | None = None
    """The fully qualified record name, for `record` and `topic_record`."""
    timeout_seconds: StrictInt = Field(default=10, gt=0)
    """HTTP timeout of a registry request."""

    @model_validator(mode="after")
    def _record_name_when_needed(self):
        if self.subject_name_strategy != "topic" and not self.record_name:
            raise ValueError(f"subject_name_strategy {self.subject_name_strategy!r} needs 'record_name'")
        if (self.username is None) != (self.password is None):
            raise ValueError("give both 'username' and 'password' for basic auth, or neither")
        if self.url is None and self.connection is None:
            raise ValueError("give the registry's 'url', or an Airflow 'connection' whose host is the registry")
        if self.connection is not None and self.username is not None:
            raise ValueError(
                "basic auth comes from the 'connection' (its login and password): drop 'username' and 'password'"
            )
        return self

    def subject(self, topic: str, key: bool = False) -> str:
        if self.subject_name_strategy == "record":
            assert self.record_name is not None  # the validator asks for it with this strategy
            return self.record_name
        suffix = "key" if key else "value"
        if self.subject_name_strategy == "topic_record":
            return f"{topic}-{self.record_name}"
        return f"{topic}-{suffix}"


class KeyFormat(_Strict):
    """How the Kafka key becomes the `kafka_key` column: raw bytes, UTF-8 text, a JSON object with a declared
    schema (a struct), or a registry format (its subject: "<topic>-key" under the topic strategy)."""

    type: Literal["raw", "string", "json", "avro", "protobuf", "json_schema"]
    """`raw` (bytes), `string` (UTF-8), `json` (a struct of the declared fields), or a registry format (subject
    `<topic>-key`). A null key stays null."""
    schema_: list[SchemaField] = Field(default_factory=list, alias="schema")
    """The declared fields of a `json` key."""

    @model_validator(mode="after")
    def _schema_matches_type(self):
        if self.type == "json" and not self.schema_:
            raise ValueError("key type 'json' needs a declared 'schema' (a list of fields)")
        if self.type != "json" and self.schema_:
            raise ValueError(f"key type {self.type!r} takes no 'schema'")
        return self


class DebeziumSettings(_Strict):
    """How a Debezium change event becomes a row (`format.envelope: debezium`)."""

    position: StrictStr = Field(default="lsn", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The field of the event's `source` kept as column `_debezium_position`: PostgreSQL `lsn`, SQL Server
    `change_lsn`, Oracle `scn`, MySQL `pos`, MongoDB `ord`. An event whose `source` lacks it is quarantined."""
    position_type: Literal[FIELD_TYPES] = "long"  # type: ignore[valid-type]
    """`json` only: the position column's type (registry formats take the writer schema's)."""
    truncate: Literal["apply", "quarantine"] = "apply"
    """A TRUNCATE event (op `t`; the connector sends it with `skipped.operations` not naming `t`): `apply`
    empties the table in the commit of the batch that reads it (the key's events after it, by `write.order_by`
    or, without it, in its partition, then apply); `quarantine` sends it to the quarantine, saying so."""
    snapshot: Literal["replace", "keep"] | None = None
    """What a snapshot's end does (a connector takes a new snapshot when it starts without offsets, as after a
    crash before its first offset flush, or with `snapshot.mode` `always`): `replace` deletes the rows of the
    table that are older than the snapshot and that it did not read, in the commit of the batch holding the
    table's last snapshot read (`source.snapshot` `last_in_data_collection`); those rows were deleted at the
    source while no change was captured. `keep` leaves them. Needs a position that grows with the source's
    log across snapshots; default: `replace` for PostgreSQL's `lsn`, SQL Server's `change_lsn` and
    `commit_lsn` and Oracle's `scn`, `keep` for others (MySQL's `pos` restarts with each binlog file)."""
    unavailable_value: StrictStr | None = Field(default="__debezium_unavailable_value", min_length=1)
    """What the connector sends for a value it does not have: the connector's `unavailable.value.placeholder`
    (its default here). PostgreSQL leaves a large (TOASTed) value out of an update that does not change it,
    unless the table's REPLICA IDENTITY is FULL. A column holding it (text, json, bytea, text and integer
    arrays, each in the connector's shape of it) keeps the row's current value: the latest earlier value of
    its key in the batch, else the table's; it is never written. None: no such value."""
    decimal_handling_mode: Literal["precise", "string", "double"] = "precise"
    """`json` only: the connector's `decimal.handling.mode`, which says how a declared `decimal(p,s)` field of
    the row arrives when the JSON converter sends no schemas: `precise` (Debezium's default) as base64 text of
    the unscaled value's bytes, `string` as decimal text, `double` as a JSON number. Each lands as the
    declared `decimal(p,s)`."""

    @property
    def replaces_on_snapshot(self) -> bool:
        """`snapshot`, or its default for the position."""
        if self.snapshot is not None:
            return self.snapshot == "replace"
        return self.position in GROWING_POSITIONS


GROWING_POSITIONS = ("lsn", "change_lsn", "commit_lsn", "scn")  # source positions that only grow


class RecordFormat(_Strict):
    type: Literal["json", "raw", "avro", "protobuf", "json_schema", "connect_json"]
    """`json` with a declared `schema`; `raw` (key and value kept as bytes); `avro`, `protobuf`,
    `json_schema` in the Confluent wire format through a Schema Registry (their columns come from it); or
    `connect_json`, Kafka Connect's JsonConverter with `schemas.enable=true` (the columns come from each
    value's own schema: formats/connect_json.py)."""
    schema_: list[SchemaField] = Field(default_factory=list, alias="schema")
    """The declared fields of a `json` value (registry formats take none)."""
    unknown_fields: Literal["drop", "keep"] = "drop"
    """Schema drift, `json` only: fields the schema does not declare are dropped, or kept as JSON text in a
    `_unknown_fields` column. A declared field whose type changes sends the record to the quarantine."""
    max_value_bytes: StrictInt = Field(default=DEFAULT_MAX_VALUE_BYTES, gt=0)
    """Values larger than this go to the quarantine whole."""
    registry: RegistrySettings | None = None
    """The Schema Registry: for `avro` (unless `schema_file`), `protobuf`, `json_schema` and registry keys."""
    schema_file: StrictStr | None = None
    """`avro` without a registry: plain Avro values (no framing) written with this `.avsc` (relative to the
    project)."""
    key: KeyFormat | None = None
    """Keep the Kafka key as column `kafka_key` (not with `raw`, whose `key` column has it). None: not kept."""
    include_headers: StrictBool = False
    """Every header as `kafka_headers`, a map of string to binary, in order, repeated names kept; in the
    quarantine table too, so a bad record keeps its headers."""
    envelope: Literal["none", "debezium"] = "none"
    """`debezium`: each value is a Debezium change event (JSON, with or without its `schema`/`payload`
    wrapper, or any registry format). Ops `c`, `r` (snapshot), `u` upsert the row in `after`; `d` deletes the
    row in `before` (its key columns suffice); the tombstone after a delete is skipped (the `d` before it
    did the delete, or compaction removed every record of its key). Columns `_debezium_op` and
    `_debezium_position` are added. Needs `write.mode: upsert`; `schema` (json) declares the row's fields."""
    debezium: DebeziumSettings = Field(default_factory=DebeziumSettings)
    """With `envelope: debezium`: which `source` field is the position."""

    @property
    def evolves(self) -> bool:
        """The table's payload columns come from the registry and may grow."""
        return (self.type in REGISTRY_FORMATS and self.schema_file is None) or self.type == "connect_json"

    @model_validator(mode="after")
    def _schema_matches_type(self):
        if self.type == "json" and not self.schema_:
            raise ValueError("format 'json' needs a declared 'schema' (a list of fields)")
        if self.type in ("raw", "connect_json", *REGISTRY_FORMATS) and self.schema_:
            raise ValueError(
                f"format {self.type!r} takes no 'schema' (raw keeps bytes; registry formats read "
                f"theirs from the registry or a schema_file; connect_json from each value)"
            )
        if self.schema_file is not None and self.type != "avro":
            raise ValueError("'schema_file' is for format 'avro' without a registry")
        if self.type == "avro" and (self.registry is None) == (self.schema_file is None):
            raise ValueError("format 'avro' needs either a 'registry' or a 'schema_file' (not both)")
        if self.type in ("protobuf", "json_schema") and self.registry is None:
            raise ValueError(f"format {self.type!r} needs a 'registry'")
        key_in_registry = self.key is not None and self.key.type in REGISTRY_FORMATS
        if self.registry is not None and self.type not in REGISTRY_FORMATS and not key_in_registry:
            raise ValueError(f"'registry' is for formats {', '.join(REGISTRY_FORMATS)} (value or key)")
        if key_in_registry and self.registry is None:
            raise ValueError(f"key type {self.key.type!r} needs a 'registry'")
        if self.type == "raw" and self.key is not None:
            raise ValueError("format 'raw' keeps the key as bytes in column 'key' and takes no 'key' section")
        names = [f.name for f in self.schema_]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"schema field {dupes[0]!r} is declared twice")
        if self.envelope == "debezium" and self.type == "raw":
            raise ValueError("envelope 'debezium' needs a format that decodes values (json or a registry format)")
        if self.envelope == "debezium" and self.schema_file is not None:
            raise ValueError("envelope 'debezium' reads Debezium's schemas from the registry, not a schema_file")
        if "debezium" in self.model_fields_set and self.envelope != "debezium":
            raise ValueError("'debezium' settings are for envelope 'debezium'")
        ours = {*LINEAGE_COLUMNS, UNKNOWN_FIELDS_COLUMN, KEY_COLUMN, HEADERS_COLUMN, *DEBEZIUM_COLUMNS}
        clash = sorted(set(names) & ours)
        if clash:
            raise ValueError(f"schema field {clash[0]!r} clashes with a column offsetlake adds")
        if self.type != "json" and self.unknown_fields == "keep":
            raise ValueError(
                "'unknown_fields: keep' needs format 'json' (raw keeps the whole value; registry "
                "formats add a column for every field a newer schema adds)"
            )
        return self

    @property
    def debezium_envelope(self) -> bool:
        return self.envelope == "debezium"

    @property
    def unavailable_value(self) -> str | None:
        """The value a Debezium connector sends for one it does not have (`debezium.unavailable_value`), or
        None when the values are not Debezium's."""
        return self.debezium.unavailable_value if self.debezium_envelope else None

    def extra_columns(self) -> list[str]:
        """Columns besides the payload and the lineage: a Debezium event's, the key and the headers, when
        asked for."""
        return [
            *(DEBEZIUM_COLUMNS if self.debezium_envelope else ()),
            *([KEY_COLUMN] if self.key else []),
            *([HEADERS_COLUMN] if self.include_headers else []),
        ]


# A commit is safe only if the store writes the next log entry only when it is absent. On S3 that is
# S3's conditional writes (If-None-Match); without them two writers racing for a version can both
# "succeed" and one commit is lost. So an s3:// table must say it has them. deltalake 1.6.6 happens to send
# If-None-Match by default, but its maintainers call that accidental (delta-io/delta-rs#4464): the setting
# keeps the safety from resting on a default. delta-rs' DynamoDB lock, the other way, is gone from it:
# with `AWS_S3_LOCKING_PROVIDER: dynamodb` it logs "no longer supports S3DynamoDBLogStores" and writes
# without the lock (measured: no item in the lock table), so that setting is refused, not trusted.
S3_SCHEMES = ("s3://", "s3a://")
PUT_IF_ABSENT = {"conditional_put": "etag", "aws_conditional_put": "etag"}


class TableSettings(_Strict):
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
    def _safe_commits_on_s3(self):
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

    def __repr_args__(self):
        for key, value in super().__repr_args__():
            yield key, (redact_client(value) if key == "storage_options" else value)


class BatchSettings(_Strict):
    max_records_per_batch: StrictInt = Field(default=1_000_000, gt=0)
    """Offset span of one batch (one Delta commit)."""
    max_records_per_task: StrictInt = Field(default=250_000, gt=0)
    """Offset span of one task (one partition slice; on a local master a Spark task per core runs several in
    order, fetching the next while writing the last)."""
    read_timeout_seconds: StrictInt = Field(default=60, gt=0)
    """A task that makes no progress this long fails."""


class WriteSettings(_Strict):
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
    def _key_for_upsert(self):
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


class MaintenanceSettings(_Strict):
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


class AirflowSettings(_Strict):
    """How Airflow retries the pipeline's ingest, stream and maintenance steps (backfill and recovery
    are never retried: what fails them, a retry meets again). See docs/concepts/faults.md."""

    retries: StrictInt | None = Field(default=None, ge=0, le=100)
    """How often Airflow retries a failed step. None: the step's own (ingest 3, stream 5, maintenance 1)."""
    retry_delay_seconds: StrictInt = Field(default=30, gt=0)
    """The first wait before a retry; it doubles, up to 10 minutes."""


# Commits in the log, or files removed within the retention, that a batch pays for cheaply: ~0.2 s a batch
# on a local disk at this size (`make soak`).
STREAM_WINDOW_BUDGET = 20_000


class PipelineConfig(_Strict):
    name: StrictStr = Field(pattern=NAME_RE)
    """Must match the file name."""
    topics: list[StrictStr] = Field(min_length=1)
    """One or more topics, read into one table, or into a table each when `table.path` holds `{table}` or
    `{topic}`. An entry starting with `^` is a regular expression matched against the cluster's topics
    when a run starts (`^pg\\.shop\\..*`): a topic created later that matches is read by the next run."""

    @field_validator("topics")
    @classmethod
    def _valid_patterns(cls, topics: list[str]) -> list[str]:
        for topic in topics:
            if topic.startswith("^"):
                try:
                    re.compile(topic)
                except re.error as err:
                    raise ValueError(f"{topic!r} is not a valid regular expression: {err}") from None
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
    description: StrictStr = ""
    """Shown on the pipeline's DAGs."""

    @model_validator(mode="after")
    def _partition_columns_exist(self):
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
    def consumer_group(self) -> str:
        return f"offsetlake.{self.name}"


def path_placeholders(path: str) -> set[str]:
    """The `{...}` fields of a table path (`{{` and `}}` are literal braces): `{table}`, `{topic}`."""
    return {field for _, field, _, _ in string.Formatter().parse(path) if field is not None}


def redact_client(client: dict[str, Any]) -> dict[str, Any]:
    return {k: ("***" if any(h in k.lower() for h in SECRET_HINTS) else v) for k, v in client.items()}


def resolve_env(value: Any, where: str = "") -> Any:
    """Replace ${VAR} and ${VAR:-default} in every string of a YAML document."""
    if isinstance(value, dict):
        return {k: resolve_env(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_env(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match) -> str:
        var, default = match.group(1), match.group(2)
        if var in os.environ:
            return os.environ[var]
        if default is not None:
            return default
        raise ConfigError(f"key {where!r} refers to environment variable {var} which is not set")

    return ENV_REF.sub(substitute, value)


def _error_line(source: str, err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown key {loc!r}"
    if first["type"] == "missing":
        return f"{source}: missing required key {loc!r}"
    msg = first["msg"].removeprefix("Value error, ")
    return f"{source}: key {loc!r}: {msg}"


def parse_pipeline(raw: Any, source: str, base_dir: Path | None = None) -> PipelineConfig:
    """Validate a loaded YAML document. Relative table paths resolve against base_dir."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of settings at the top level")
    resolved = resolve_env(raw)
    try:
        cfg = PipelineConfig.model_validate(resolved)
    except ValidationError as err:
        raise ConfigError(_error_line(source, err)) from None
    if base_dir is not None:
        cfg = _absolute_paths(cfg, base_dir)
    register_storage(cfg)
    return cfg


def register_storage(cfg: PipelineConfig) -> None:
    """Give files.py the storage options of the pipeline's table and quarantine (the default quarantine
    beside the table takes the table's)."""
    files.register_storage(cfg.table_path, effective_storage_options(cfg.table))
    files.register_storage(cfg.quarantine_path, effective_storage_options(cfg.quarantine or cfg.table))


def effective_storage_options(table: TableSettings) -> dict[str, str]:
    """What every reader and writer of an object-store table is given: the pipeline's storage options, with
    `retry_seconds` as delta-rs' retry bound (object_store stops after 10 retries, ~3 s, by default: too
    short for a store that answers 503 SlowDown for a while). Local tables get none."""
    if "://" not in table.path or table.path.startswith("file://"):
        return dict(table.storage_options)
    given = {k.lower() for k in table.storage_options}
    retry = {"retry_timeout": f"{table.retry_seconds}s", "max_retries": str(max(table.retry_seconds, 1) * 4)}
    return {**{k: v for k, v in retry.items() if k not in given}, **table.storage_options}


def _absolute_paths(cfg: PipelineConfig, base_dir: Path) -> PipelineConfig:
    def absolute(t: TableSettings | None) -> TableSettings | None:
        if t is None or "://" in t.path or os.path.isabs(t.path):
            return t
        return t.model_copy(update={"path": str((base_dir / t.path).resolve())})

    update: dict[str, Any] = {"table": absolute(cfg.table), "quarantine": absolute(cfg.quarantine)}
    schema_file = cfg.format.schema_file
    if schema_file and not os.path.isabs(schema_file):
        update["format"] = cfg.format.model_copy(update={"schema_file": str((base_dir / schema_file).resolve())})
    return cfg.model_copy(update=update)


def project_home() -> Path:
    return Path(os.environ.get("OFFSETLAKE_HOME", os.getcwd())).resolve()


def pipelines_dir() -> Path:
    return Path(os.environ.get("OFFSETLAKE_PIPELINES_DIR", project_home() / "include" / "pipelines"))


def load_pipeline(name: str, directory: Path | str | None = None) -> PipelineConfig:
    """Load include/pipelines/<name>.yaml (or <directory>/<name>.yaml)."""
    if not re.match(NAME_RE, name or ""):
        raise ConfigError(f"invalid pipeline name {name!r}: use letters, digits, '_' and '-'")
    directory = Path(directory) if directory else pipelines_dir()
    path = directory / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(list_pipelines(directory)) or "none"
        raise ConfigError(f"unknown pipeline {name!r}: no {path} (known: {known})")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}") from None
    cfg = parse_pipeline(raw, str(path), base_dir=project_home())
    if cfg.name != name:
        raise ConfigError(f"{path}: key 'name' is {cfg.name!r} but the file is named {name!r}")
    return cfg


def list_pipelines(directory: Path | str | None = None) -> list[str]:
    directory = Path(directory) if directory else pipelines_dir()
    return sorted(p.stem for p in directory.glob("*.yaml")) if directory.is_dir() else []

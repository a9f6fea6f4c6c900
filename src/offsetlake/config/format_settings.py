"""How a pipeline's records are encoded: `format` (raw, JSON, a registry format, Debezium's envelope) and
its key."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import (
    Field,
    SecretStr,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from offsetlake.config.columns import (
    DEBEZIUM_COLUMNS,
    FIELD_TYPES,
    HEADERS_COLUMN,
    KEY_COLUMN,
    LINEAGE_COLUMNS,
    REGISTRY_FORMATS,
    UNKNOWN_FIELDS_COLUMN,
    decimal_type,
)
from offsetlake.config.strict import Strict

DEFAULT_MAX_VALUE_BYTES = 1_048_576  # Kafka's own default message size limit


class SchemaField(Strict):
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


class RegistrySettings(Strict):
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
    def _record_name_when_needed(self) -> Self:
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


class KeyFormat(Strict):
    """How the Kafka key becomes the `kafka_key` column: raw bytes, UTF-8 text, a JSON object with a declared
    schema (a struct), or a registry format (its subject: "<topic>-key" under the topic strategy)."""

    type: Literal["raw", "string", "json", "avro", "protobuf", "json_schema"]
    """`raw` (bytes), `string` (UTF-8), `json` (a struct of the declared fields), or a registry format (subject
    `<topic>-key`). A null key stays null."""
    schema_: list[SchemaField] = Field(default_factory=list, alias="schema")
    """The declared fields of a `json` key."""

    @model_validator(mode="after")
    def _schema_matches_type(self) -> Self:
        if self.type == "json" and not self.schema_:
            raise ValueError("key type 'json' needs a declared 'schema' (a list of fields)")
        if self.type != "json" and self.schema_:
            raise ValueError(f"key type {self.type!r} takes no 'schema'")
        return self


class DebeziumSettings(Strict):
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


class RecordFormat(Strict):
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
    def _schema_matches_type(self) -> Self:
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
        if key_in_registry and self.registry is None and self.key is not None:
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

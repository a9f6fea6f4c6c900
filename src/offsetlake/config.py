"""Pipeline configuration: one YAML file per pipeline under include/pipelines/.

Validation is pydantic's (extra keys forbidden, strict types) so every mistake
names its key; errors are flattened to one line because they reach a terminal
or an Airflow task log. `${VAR}` / `${VAR:-default}` references are resolved
from the environment at load time so secrets never live in the file.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, SecretStr, StrictBool, StrictFloat, StrictInt, StrictStr,
                      ValidationError, model_validator)

from offsetlake.errors import ConfigError

ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$"
# Client settings whose values must never be printed.
SECRET_HINTS = ("password", "secret", "token", "sasl.oauthbearer.config", "ssl.key.pem", "credentials")
# Settings offsetlake owns: a pipeline may not override them, because the batch protocol depends on them.
RESERVED_CLIENT_KEYS = {
    "bootstrap.servers", "group.id", "isolation.level", "enable.auto.commit",
    "enable.auto.offset.store", "auto.offset.reset", "enable.partition.eof",
    "transactional.id",
}
FIELD_TYPES = ("string", "long", "int", "double", "float", "boolean", "timestamp", "date", "binary")
LINEAGE_COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp")
RAW_COLUMNS = ("key", "value")
KEY_COLUMN = "kafka_key"  # format.key: the decoded Kafka key (formats other than raw)
HEADERS_COLUMN = "kafka_headers"  # format.include_headers: map<string, binary>, every header in order
# Formats in the Confluent wire format (magic byte 0, 4-byte schema id, payload): the table's payload
# columns come from the registry and grow when a record arrives with a newer schema (README, Formats).
REGISTRY_FORMATS = ("avro", "protobuf", "json_schema")
UNKNOWN_FIELDS_COLUMN = "_unknown_fields"  # unknown_fields: keep -> JSON text of the undeclared fields
DEFAULT_MAX_VALUE_BYTES = 1_048_576  # Kafka's own default message size limit


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaSettings(_Strict):
    # Either here, or from the Airflow connection's extra (`connection`).
    bootstrap_servers: StrictStr | None = None
    # An Airflow connection (the Apache Kafka provider's type, conn_type "kafka"): its extra holds librdkafka
    # settings (bootstrap.servers, security.protocol, sasl.*, ssl.*). Resolved where the Airflow task runs
    # (offsetlake.connections); `client` settings here win over the connection's. The CLI uses ${ENV} instead.
    connection: StrictStr | None = None
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    client: dict[StrictStr, StrictStr | StrictInt | StrictBool] = Field(default_factory=dict)
    timeout_seconds: StrictInt = Field(default=30, gt=0)
    # How long a retriable error (broker restart, leader change...) is retried, with backoff; 0: never.
    retry_seconds: StrictInt = Field(default=120, ge=0)

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
    name: StrictStr = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    type: Literal[FIELD_TYPES]  # type: ignore[valid-type]
    required: StrictBool = False


class RegistrySettings(_Strict):
    """A Confluent-compatible Schema Registry (Confluent, Karapace, Apicurio's ccompat API)."""
    # Either here, or from the Airflow connection (`connection`).
    url: StrictStr | None = Field(default=None, pattern=r"^https?://")
    # An Airflow HTTP connection: its host (and schema, port) give the URL when `url` is not set, its login and
    # password the basic auth. Resolved where the Airflow task runs (offsetlake.connections).
    connection: StrictStr | None = None
    # Basic auth: write them as ${ENV} references; they are never printed (SecretStr) nor logged.
    username: SecretStr | None = None
    password: SecretStr | None = None
    # Which subject holds the schema the table is created from: topic -> "<topic>-value";
    # record -> "<record_name>"; topic_record -> "<topic>-<record_name>" (Confluent's three strategies).
    subject_name_strategy: Literal["topic", "record", "topic_record"] = "topic"
    record_name: StrictStr | None = None  # the fully qualified record name, for record and topic_record
    timeout_seconds: StrictInt = Field(default=10, gt=0)

    @model_validator(mode="after")
    def _record_name_when_needed(self):
        if self.subject_name_strategy != "topic" and not self.record_name:
            raise ValueError(f"subject_name_strategy {self.subject_name_strategy!r} needs 'record_name'")
        if (self.username is None) != (self.password is None):
            raise ValueError("give both 'username' and 'password' for basic auth, or neither")
        if self.url is None and self.connection is None:
            raise ValueError("give the registry's 'url', or an Airflow 'connection' whose host is the registry")
        if self.connection is not None and self.username is not None:
            raise ValueError("basic auth comes from the 'connection' (its login and password): drop 'username' and "
                             "'password'")
        return self

    def subject(self, topic: str, key: bool = False) -> str:
        if self.subject_name_strategy == "record":
            return self.record_name
        suffix = "key" if key else "value"
        if self.subject_name_strategy == "topic_record":
            return f"{topic}-{self.record_name}"
        return f"{topic}-{suffix}"


class KeyFormat(_Strict):
    """How the Kafka key becomes the `kafka_key` column: raw bytes, UTF-8 text, a JSON object with a declared
    schema (a struct), or a registry format (its subject: "<topic>-key" under the topic strategy)."""
    type: Literal["raw", "string", "json", "avro", "protobuf", "json_schema"]
    schema_: list[SchemaField] = Field(default_factory=list, alias="schema")

    @model_validator(mode="after")
    def _schema_matches_type(self):
        if self.type == "json" and not self.schema_:
            raise ValueError("key type 'json' needs a declared 'schema' (a list of fields)")
        if self.type != "json" and self.schema_:
            raise ValueError(f"key type {self.type!r} takes no 'schema'")
        return self


class RecordFormat(_Strict):
    type: Literal["json", "raw", "avro", "protobuf", "json_schema"]
    schema_: list[SchemaField] = Field(default_factory=list, alias="schema")
    # Schema drift: fields the schema does not declare are dropped, or kept as JSON text in
    # UNKNOWN_FIELDS_COLUMN. A declared field whose type changes sends the record to quarantine.
    unknown_fields: Literal["drop", "keep"] = "drop"
    # Values above this many bytes go to quarantine instead of the table.
    max_value_bytes: StrictInt = Field(default=DEFAULT_MAX_VALUE_BYTES, gt=0)
    registry: RegistrySettings | None = None
    # avro without a registry: plain Avro binary values written with this schema (.avsc), no framing.
    schema_file: StrictStr | None = None
    key: KeyFormat | None = None
    include_headers: StrictBool = False

    @property
    def evolves(self) -> bool:
        """The table's payload columns come from the registry and may grow."""
        return self.type in REGISTRY_FORMATS and self.schema_file is None

    @model_validator(mode="after")
    def _schema_matches_type(self):
        if self.type == "json" and not self.schema_:
            raise ValueError("format 'json' needs a declared 'schema' (a list of fields)")
        if self.type in ("raw", *REGISTRY_FORMATS) and self.schema_:
            raise ValueError(f"format {self.type!r} takes no 'schema' (raw keeps bytes; registry formats read "
                             f"theirs from the registry or a schema_file)")
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
        clash = sorted(set(names) & {*LINEAGE_COLUMNS, UNKNOWN_FIELDS_COLUMN, KEY_COLUMN, HEADERS_COLUMN})
        if clash:
            raise ValueError(f"schema field {clash[0]!r} clashes with a column offsetlake adds")
        if self.type != "json" and self.unknown_fields == "keep":
            raise ValueError("'unknown_fields: keep' needs format 'json' (raw keeps the whole value; registry "
                             "formats add a column for every field a newer schema adds)")
        return self

    def extra_columns(self) -> list[str]:
        """Columns besides the payload and the lineage: the key and the headers, when asked for."""
        return [*([KEY_COLUMN] if self.key else []), *([HEADERS_COLUMN] if self.include_headers else [])]


class TableSettings(_Strict):
    path: StrictStr
    partition_by: list[StrictStr] = Field(default_factory=list)


class BatchSettings(_Strict):
    max_records_per_batch: StrictInt = Field(default=1_000_000, gt=0)
    max_records_per_task: StrictInt = Field(default=250_000, gt=0)
    read_timeout_seconds: StrictInt = Field(default=60, gt=0)


class MaintenanceSettings(_Strict):
    """How the table stays cheap to read and to commit to, however old it gets. See README, "Maintenance"."""
    checkpoint_interval: StrictInt = Field(default=10, gt=0)  # commits between Delta checkpoints (as Delta Spark)
    # Commit files older than this are removed; fractions allowed (0.25: six hours), at least an hour.
    log_retention_days: StrictFloat = Field(default=30, ge=1 / 24)
    # Removed data files are kept this long (time travel, RESTORE); vacuum deletes them after.
    deleted_file_retention_hours: StrictInt = Field(default=168, ge=1)
    target_file_mb: StrictInt = Field(default=128, gt=0)  # optimize packs small files up to this size
    zorder_by: list[StrictStr] = Field(default_factory=list)  # optimize sorts each new file by these columns
    compact_every_batches: StrictInt = Field(default=50, ge=0)  # stream compacts what it wrote; 0: never

    def table_properties(self) -> dict[str, str]:
        """Delta table properties of the tables offsetlake creates."""
        days = self.log_retention_days
        log_retention = f"interval {int(days)} days" if days == int(days) else f"interval {round(days * 24 * 60)} minutes"
        return {"delta.checkpointInterval": str(self.checkpoint_interval),
                "delta.logRetentionDuration": log_retention,
                "delta.enableExpiredLogCleanup": "true",
                "delta.deletedFileRetentionDuration": f"interval {self.deleted_file_retention_hours} hours"}

    def stream_window_warning(self, interval_seconds: float) -> str | None:
        """One line when a stream committing every `interval_seconds` would keep more commits in its log, or
        remove more files within the deleted-file retention, than a batch can afford to pay for.

        Every batch lists the commit files in `_delta_log` (on a local disk, each costs a few
        microseconds a batch) and every checkpoint carries the files removed within the deleted-file
        retention (its tombstones): the per-batch cost is bounded by these two windows, not by the
        table's age, but the windows must fit the commit rate (`make soak`; README, Maintenance)."""
        per_day = 86_400 / interval_seconds
        commits, removed = self.log_retention_days * per_day, self.deleted_file_retention_hours / 24 * per_day
        if max(commits, removed) <= STREAM_WINDOW_BUDGET:
            return None
        return (f"a stream every {interval_seconds:g} s keeps ~{commits:,.0f} commits in its log "
                f"(maintenance.log_retention_days {self.log_retention_days:g}) and ~{removed:,.0f} removed files "
                f"in its checkpoints (maintenance.deleted_file_retention_hours {self.deleted_file_retention_hours}); "
                f"each batch pays for both: keep them under {STREAM_WINDOW_BUDGET:,} (README, Maintenance)")


class AirflowSettings(_Strict):
    """How Airflow retries the pipeline's ingest, stream and maintenance steps (backfill and recovery
    are never retried: what fails them, a retry meets again). See README, "Riding out faults"."""
    retries: StrictInt | None = Field(default=None, ge=0, le=100)  # None: the operator's (ingest 3, stream 5)
    retry_delay_seconds: StrictInt = Field(default=30, gt=0)  # the first wait; it doubles, up to 10 minutes


# Commits in the log, or files removed within the retention, that a batch pays for cheaply: ~0.2 s a batch
# on a local disk at this size (`make soak`).
STREAM_WINDOW_BUDGET = 20_000


class PipelineConfig(_Strict):
    name: StrictStr = Field(pattern=NAME_RE)
    topics: list[StrictStr] = Field(min_length=1)
    kafka: KafkaSettings
    table: TableSettings
    format: RecordFormat
    batch: BatchSettings = Field(default_factory=BatchSettings)
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    on_data_loss: Literal["fail", "skip"] = "fail"
    # batch: the ingest DAG runs on `schedule`; stream: the stream DAG keeps one run going. The other
    # DAG is not scheduled (it can still be triggered: the ledger serialises whatever runs).
    mode: Literal["batch", "stream"] = "batch"
    schedule: StrictStr | None = "@hourly"
    stream_interval_seconds: float = Field(default=5.0, gt=0)
    quarantine: TableSettings | None = None
    maintenance: MaintenanceSettings = Field(default_factory=MaintenanceSettings)
    airflow: AirflowSettings = Field(default_factory=AirflowSettings)
    description: StrictStr = ""

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
        if len(set(self.topics)) != len(self.topics):
            raise ValueError("topics lists a topic twice")
        if self.mode == "stream" and "schedule" in self.model_fields_set and self.schedule is not None:
            raise ValueError("schedule is the ingest DAG's, for mode 'batch'; in mode 'stream' the stream DAG "
                             "runs all the time (leave schedule out)")
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

    @property
    def table_path(self) -> str:
        return self.table.path

    @property
    def quarantine_path(self) -> str:
        return self.quarantine.path if self.quarantine else self.table.path.rstrip("/") + "_quarantine"

    @property
    def consumer_group(self) -> str:
        return f"offsetlake.{self.name}"


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
    if base_dir is None:
        return cfg
    return _absolute_paths(cfg, base_dir)


def _absolute_paths(cfg: PipelineConfig, base_dir: Path) -> PipelineConfig:
    def absolute(t: TableSettings | None) -> TableSettings | None:
        if t is None or "://" in t.path or os.path.isabs(t.path):
            return t
        return t.model_copy(update={"path": str((base_dir / t.path).resolve())})

    update = {"table": absolute(cfg.table), "quarantine": absolute(cfg.quarantine)}
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

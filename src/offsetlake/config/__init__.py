"""A pipeline's configuration: `model` (the file's pydantic model; `format_settings` its `format` part,
`operation_settings` its `airflow` and `alerts` parts, `strict` what every model shares), `columns` (the
column vocabulary), `discovery` (finding and loading pipeline files), `connections` (Airflow connections
applied), `topic_tables` (the tables of a per-topic pipeline). Imports: errors, storage (a table's
Location); nothing that reads records or talks to Kafka."""

from offsetlake.config.columns import (
    DEBEZIUM_COLUMNS,
    DEBEZIUM_OP_COLUMN,
    DEBEZIUM_POSITION_COLUMN,
    DECIMAL_TYPE,
    DELETED_COLUMN,
    FIELD_TYPES,
    HEADERS_COLUMN,
    KEY_COLUMN,
    LINEAGE_COLUMNS,
    NEW_KEY_COLUMN,
    OLD_KEY_COLUMN,
    RAW_COLUMNS,
    REGISTRY_FORMATS,
    STAGING_COLUMNS,
    UNKNOWN_FIELDS_COLUMN,
    decimal_type,
)
from offsetlake.config.discovery import list_pipelines, load_pipeline, parse_pipeline, pipelines_dir, project_home
from offsetlake.config.format_settings import KeyFormat, RecordFormat, RegistrySettings, SchemaField
from offsetlake.config.model import RESERVED_CLIENT_KEYS, KafkaSettings, PipelineConfig, TableSettings
from offsetlake.config.strict import path_placeholders, redact_client

__all__ = [
    "FIELD_TYPES",
    "LINEAGE_COLUMNS",
    "RAW_COLUMNS",
    "KEY_COLUMN",
    "HEADERS_COLUMN",
    "REGISTRY_FORMATS",
    "DELETED_COLUMN",
    "NEW_KEY_COLUMN",
    "OLD_KEY_COLUMN",
    "STAGING_COLUMNS",
    "DEBEZIUM_OP_COLUMN",
    "DEBEZIUM_POSITION_COLUMN",
    "DEBEZIUM_COLUMNS",
    "UNKNOWN_FIELDS_COLUMN",
    "DECIMAL_TYPE",
    "decimal_type",
    "list_pipelines",
    "load_pipeline",
    "parse_pipeline",
    "pipelines_dir",
    "project_home",
    "KeyFormat",
    "RecordFormat",
    "RegistrySettings",
    "SchemaField",
    "RESERVED_CLIENT_KEYS",
    "KafkaSettings",
    "PipelineConfig",
    "TableSettings",
    "path_placeholders",
    "redact_client",
]

"""A pipeline's configuration: the file's model, the column vocabulary, finding and loading pipeline files,
Airflow connections and the tables of a per-topic pipeline."""

from offsetlake.config.columns import *  # noqa: F403 -- the column vocabulary, under the package's name
from offsetlake.config.discovery import list_pipelines, load_pipeline, parse_pipeline, pipelines_dir, project_home
from offsetlake.config.format_settings import KeyFormat, RecordFormat, RegistrySettings, SchemaField
from offsetlake.config.model import RESERVED_CLIENT_KEYS, KafkaSettings, PipelineConfig, TableSettings
from offsetlake.config.strict import path_placeholders, redact_client

"""A pipeline's datasets in OpenLineage's naming (https://openlineage.io/docs/spec/naming).

Kafka topics: namespace `kafka://{first bootstrap server}`, name the topic. The Delta table:
namespace `file` and the absolute path for a local table, else `{scheme}://{bucket or host}` and
the path in it. The output carries the table version a run committed (the `version` facet) and
the rows it added (`outputStatistics`), when it committed anything.
"""

from __future__ import annotations

import urllib.parse

from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import (
    DatasetFacet,
    OutputDatasetFacet,
    dataset_version_dataset,
    output_statistics_output_dataset,
)

from offsetlake.config import PipelineConfig


def kafka_namespace(cfg: PipelineConfig) -> str:
    # With kafka.connection and no bootstrap_servers in the file, the connection id names the cluster (the
    # lineage is built in the task process, which does not resolve the connection a second time for it).
    first = (cfg.kafka.bootstrap_servers or f"airflow-connection-{cfg.kafka.connection}").split(",")[0].strip()
    return f"kafka://{first.split('://')[-1]}"


def table_dataset_name(path: str) -> tuple[str, str]:
    parsed = urllib.parse.urlparse(path)
    if parsed.scheme in ("", "file"):
        return "file", parsed.path if parsed.scheme else path
    return f"{parsed.scheme}://{parsed.netloc}", parsed.path.lstrip("/")


def pipeline_datasets(cfg: PipelineConfig, committed: dict | None = None) -> tuple[list[InputDataset], OutputDataset]:
    """`committed`: what a task committed (`status.commits_of_task_try`): versions and rows."""
    inputs = [InputDataset(namespace=kafka_namespace(cfg), name=topic) for topic in cfg.topics]
    namespace, name = table_dataset_name(cfg.table_path)
    facets: dict[str, DatasetFacet] = {}
    output_facets: dict[str, OutputDatasetFacet] = {}
    if committed and committed.get("versions"):
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(
            datasetVersion=str(max(committed["versions"]))
        )
        output_facets["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
            rowCount=committed.get("rows", 0)
        )
    return inputs, OutputDataset(namespace=namespace, name=name, facets=facets, outputFacets=output_facets)

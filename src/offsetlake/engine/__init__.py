"""The commit engines: the seam a pipeline table's batches go through (`seam.CommitEngine`), delta-rs
(`delta_rs.DeltaRs`, the default) and delta-spark (`delta_spark.DeltaSpark`), and `engine_for`, which
picks a pipeline's by its `table.engine`."""

from __future__ import annotations

from typing import Any

from offsetlake.config import PipelineConfig
from offsetlake.engine.delta_rs import DeltaRs
from offsetlake.engine.delta_spark import DeltaSpark
from offsetlake.engine.seam import CommitEngine, Snapshot

__all__ = ["CommitEngine", "DeltaRs", "DeltaSpark", "Snapshot", "engine_for"]


def engine_for(cfg: PipelineConfig, spark: Any = None) -> CommitEngine:
    """The engine that commits `cfg`'s table; delta-spark's commits in `spark` (a session, or a LazySession
    started when the engine first needs it; without one it reads, and refuses to commit)."""
    if cfg.table.engine == "delta-spark":
        return DeltaSpark(cfg, spark)
    return DeltaRs(cfg)

"""Validate what a user typed into a trigger form, before any Spark step runs.

Airflow's Params check the JSON types first (integers, booleans, enums); these
functions check the rest (end after start, partitions that exist, text that
holds no path or shell fragment) and turn the input into the exact, canonical
arguments the Spark job receives. Nothing reaches spark-submit un-normalised.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable

from offsetlake.config import PipelineConfig
from offsetlake.errors import ConfigError
from offsetlake.kafka import KafkaCluster, topic_lister
from offsetlake.protocol.ranges import OffsetRange

# Free text (a reset reason) may be prose, but never a path or a shell fragment.
SAFE_TEXT = re.compile(r"^[A-Za-z0-9 .,:_()'#%+=-]{1,500}$")
MAX_OFFSET = 10**18


def _integer(value, what: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be a whole number, got {value!r}")
    if not minimum <= value < MAX_OFFSET:
        raise ConfigError(f"{what} must be between {minimum} and {MAX_OFFSET}, got {value}")
    return value


def _time(value, what: str) -> dt.datetime:
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be an ISO 8601 time, got {value!r}")
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as err:
        raise ConfigError(f"{what} must be an ISO 8601 time like 2026-11-22T10:00:00Z, got {value!r}") from err
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def check_pipeline(cfg: PipelineConfig, conf: dict) -> None:
    name = conf.get("pipeline", cfg.name)
    if name != cfg.name:
        raise ConfigError(f"unknown pipeline {name!r}: this DAG runs pipeline {cfg.name!r}")


def form_tables(cfg: PipelineConfig, conf: dict, cluster: KafkaCluster | None = None, one: bool = False) -> list[str]:
    """The tables a per-topic pipeline's Spark step is mapped over: the form's `table`, or (empty) every
    table the pipeline has now; `one`: the form must name one. [] for a pipeline with one table, whose
    form has no `table` to fill in."""
    from offsetlake.config.topic_tables import per_topic, pipeline_tables, select

    check_pipeline(cfg, conf)
    name = conf.get("table") or None
    if name is not None and (not isinstance(name, str) or not re.match(r"^[A-Za-z0-9_.\-]{1,249}$", name)):
        raise ConfigError(f"table must be a table's name (letters, digits, '.', '_', '-'), got {name!r}")
    if not per_topic(cfg):
        if name is not None:
            raise ConfigError(f"table {name!r}: pipeline {cfg.name!r} writes one table; leave table empty")
        return []
    tables = select(pipeline_tables(cfg, _topic_names(cfg, cluster)), cfg, name)
    if one and name is None:
        known = ", ".join(t.name or "" for t in tables)
        raise ConfigError(f"table: name the table (pipeline {cfg.name!r} writes one per topic: {known})")
    return [t.name or "" for t in tables]


def _form_table(cfg: PipelineConfig, conf: dict, cluster: KafkaCluster | None) -> PipelineConfig:
    """The single-table pipeline of the form's `table` (or the pipeline's one table, its topic patterns
    resolved)."""
    from offsetlake.config.topic_tables import only_table

    return only_table(cfg, conf.get("table") or None, _topic_names(cfg, cluster))


def _topic_names(cfg: PipelineConfig, cluster: KafkaCluster | None) -> Callable[[], list[str]]:
    return (lambda: cluster.topic_names()) if cluster is not None else topic_lister(cfg.kafka)


def backfill_ranges(cfg: PipelineConfig, conf: dict, cluster: KafkaCluster | None = None) -> str:
    """The `--ranges` argument for jobs/backfill.py: explicit ranges, or a time window resolved to offsets
    (of the form's `table`, for a pipeline that writes a table per topic)."""
    check_pipeline(cfg, conf)
    cluster = cluster or KafkaCluster(cfg.kafka)
    cfg = _form_table(cfg, conf, cluster)
    raw_ranges = conf.get("ranges") or []
    window = (conf.get("time_from"), conf.get("time_to"))
    if raw_ranges and any(window):
        raise ConfigError("give either ranges or a time window (time_from, time_to), not both")
    if not raw_ranges and not all(window):
        raise ConfigError("give ranges, or both time_from and time_to")
    if raw_ranges:
        ranges = [_range(cfg, item, i) for i, item in enumerate(raw_ranges)]
        known = set(cluster.partitions(cfg.topics))
        for i, r in enumerate(ranges):
            if (r.topic, r.partition) not in known:
                raise ConfigError(f"ranges[{i}]: unknown partition {r.topic}[{r.partition}]")
    else:
        from offsetlake.operations.backfill import ranges_for_time_window

        ranges = ranges_for_time_window(cfg, cluster, _time(window[0], "time_from"), _time(window[1], "time_to"))
        if not ranges:
            raise ConfigError("no records in that time window")
    return ",".join(f"{r.topic}:{r.partition}:{r.start}-{r.end}" for r in ranges)


def _range(cfg: PipelineConfig, item, index: int) -> OffsetRange:
    where = f"ranges[{index}]"
    if not isinstance(item, dict) or set(item) - {"topic", "partition", "start", "end"}:
        raise ConfigError(f"{where} must be an object with topic, partition, start and end")
    topic = item.get("topic")
    if topic not in cfg.topics:
        raise ConfigError(f"{where}.topic {topic!r} is not one of the pipeline's topics {cfg.topics}")
    partition = _integer(item.get("partition"), f"{where}.partition")
    start = _integer(item.get("start"), f"{where}.start")
    end = _integer(item.get("end"), f"{where}.end")
    if end <= start:
        raise ConfigError(f"{where}: end {end} must be greater than start {start}")
    return OffsetRange(topic, partition, start, end)


def _flags(conf: dict, keys: tuple[str, ...], default: bool) -> dict[str, bool]:
    """The form's switches: each must be a real boolean (never "yes" or 1)."""
    flags = {}
    for key in keys:
        value = conf.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        flags[key] = value
    return flags


def recovery_args(cfg: PipelineConfig, conf: dict) -> dict[str, str]:
    """Arguments for jobs/recovery.py, as strings, from the recovery form."""
    check_pipeline(cfg, conf)
    from offsetlake.config.topic_tables import per_topic

    flags = _flags(conf, ("repair", "cleanup", "reset"), default=False)
    older = _integer(conf.get("cleanup_older_than_seconds", 3600), "cleanup_older_than_seconds", minimum=60)
    args = {
        "repair": str(flags["repair"]).lower(),
        "cleanup": str(flags["cleanup"]).lower(),
        "older_than": str(older),
        "reset_offsets": "",
        "reason": "",
    }
    if not flags["reset"]:
        if conf.get("reset_offsets"):
            raise ConfigError("reset_offsets were given but reset is false: set reset to true to move the ledger")
        return args
    items = conf.get("reset_offsets") or []
    if not items:
        raise ConfigError("reset is true but reset_offsets is empty")
    if per_topic(cfg) and not conf.get("table"):
        raise ConfigError("reset: name the table whose ledger moves (table)")
    cfg = _form_table(cfg, conf, None)
    reason = conf.get("reset_reason") or ""
    if not isinstance(reason, str) or not SAFE_TEXT.match(reason):
        raise ConfigError(
            "reset_reason must be 1-500 characters of letters, digits, spaces and .,:_()'#%+=- "
            "(no paths or shell characters)"
        )
    offsets = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) - {"topic", "partition", "offset"}:
            raise ConfigError(f"reset_offsets[{i}] must be an object with topic, partition and offset")
        if item.get("topic") not in cfg.topics:
            raise ConfigError(f"reset_offsets[{i}].topic {item.get('topic')!r} is not one of {cfg.topics}")
        partition = _integer(item.get("partition"), f"reset_offsets[{i}].partition")
        offset = _integer(item.get("offset"), f"reset_offsets[{i}].offset")
        offsets.append(f"{item['topic']}:{partition}={offset}")
    args.update(reset_offsets=",".join(offsets), reason=reason)
    return args


def maintenance_args(cfg: PipelineConfig, conf: dict) -> dict[str, str]:
    """Arguments for jobs/maintenance.py, as strings, from the maintenance form."""
    from offsetlake.operations.maintenance import MIN_VACUUM_RETENTION_HOURS

    check_pipeline(cfg, conf)
    switches = _flags(conf, ("optimize", "vacuum", "checkpoint"), default=True)
    if not any(switches.values()):
        raise ConfigError("nothing to do: set optimize, vacuum or checkpoint")
    flags = {key: str(value).lower() for key, value in switches.items()}
    settings = cfg.maintenance
    retention = _integer(
        conf.get("vacuum_retention_hours", settings.deleted_file_retention_hours), "vacuum_retention_hours", minimum=1
    )
    if retention < MIN_VACUUM_RETENTION_HOURS:
        raise ConfigError(f"vacuum_retention_hours must be at least {MIN_VACUUM_RETENTION_HOURS} (the clean-up window)")
    target = _integer(conf.get("target_file_mb", settings.target_file_mb), "target_file_mb", minimum=1)
    zorder = conf.get("zorder_by", list(settings.zorder_by)) or []
    columns = cfg.data_columns()
    # Registry formats learn their columns from the table: the maintenance step checks them there.
    if not isinstance(zorder, list) or any(c not in columns and not cfg.format.evolves for c in zorder):
        raise ConfigError(f"zorder_by must be a list of data columns of the table: {columns}")
    return {**flags, "retention_hours": str(retention), "target_file_mb": str(target), "zorder_by": ",".join(zorder)}

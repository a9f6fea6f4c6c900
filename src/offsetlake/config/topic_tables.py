"""A pipeline's tables: one table for all its topics, or one table (and ledger) per topic.

Two things in a pipeline file make this more than a list of names:

- **A topic pattern.** An entry of `topics` that starts with `^` is a regular expression (librdkafka's
  convention), matched from the start of each topic's name: `^pg\\.shop\\..*` reads every topic of the
  `shop` schema. Kafka's internal topics (`__consumer_offsets`, ...) never match. The topics are listed
  when a run starts, so a topic created later that matches is read by the next run. A run whose patterns
  match nothing is refused (`NoTopicMatches`); a stream waits for a first topic instead.
- **A table per topic.** A `table.path` holding `{table}` (the topic's last dot-separated segment:
  `pg.shop.orders` -> `orders`, Debezium's table name) or `{topic}` (the whole name) gives each topic a
  table of its own, with a ledger of its own: each table commits, fails, retries and lags on its own. A
  table's name is what `{table}` gives, or the topic under `{topic}`; the CLI's `--table` and the Airflow
  task map name tables by it.

`pipeline_tables` turns a pipeline into its tables as of now (reading the cluster's topic list once);
each is a plain single-table pipeline, so the batch protocol, audit and maintenance are the same code for
both kinds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from offsetlake.config.model import PipelineConfig
from offsetlake.config.strict import path_placeholders
from offsetlake.errors import ConfigError


class NoTopicMatches(ConfigError):
    """A pipeline's topic patterns match no topic in the cluster (yet: a connector creates its topics with
    its first events, so a stream waits for one; any other run is refused)."""


PATTERN_PREFIX = "^"
INTERNAL_PREFIX = "__"  # Kafka's own topics (__consumer_offsets, __transaction_state): never a pattern's
PLACEHOLDERS = ("table", "topic")


@dataclass(frozen=True)
class PipelineTable:
    """One table of a pipeline: its name (None when the pipeline writes one table) and the pipeline as a
    single-table pipeline for it (concrete topics, the table's own path)."""

    name: str | None
    cfg: PipelineConfig

    @property
    def label(self) -> str:
        """`pipeline/table`, or the pipeline's name when it writes one table."""
        return self.cfg.name if self.name is None else f"{self.cfg.name}/{self.name}"


def is_pattern(topic: str) -> bool:
    return topic.startswith(PATTERN_PREFIX)


def per_topic(cfg: PipelineConfig) -> bool:
    """True when the pipeline writes a table per topic (its table.path holds {table} or {topic})."""
    return bool(path_placeholders(cfg.table.path))


def table_name(topic: str, path_template: str) -> str:
    """The name of a topic's table: `{table}`'s value (the last dot-separated segment), or under a path
    that only uses `{topic}`, the topic itself."""
    return topic.rsplit(".", 1)[-1] if "table" in path_placeholders(path_template) else topic


def matching_topics(cfg: PipelineConfig, cluster_topics: Iterable[str]) -> list[str]:
    """The pipeline's topics as of the cluster's topic list: the ones named, then those a pattern matches,
    each once, in the order of the list. A named topic is kept even if missing (reading it says so)."""
    cluster_topics = sorted(cluster_topics)
    chosen: list[str] = []
    for entry in cfg.topics:
        found = (
            [t for t in cluster_topics if re.match(entry, t) and not t.startswith(INTERNAL_PREFIX)]
            if is_pattern(entry)
            else [entry]
        )
        chosen.extend(t for t in found if t not in chosen)
    return chosen


def resolve(cfg: PipelineConfig, cluster_topics: Iterable[str]) -> list[PipelineTable]:
    """The pipeline's tables given the cluster's topics (pure: no Kafka). Refused in one line: patterns
    matching nothing, two topics whose tables share a path."""
    topics = matching_topics(cfg, cluster_topics)
    if not topics:
        patterns = ", ".join(repr(t) for t in cfg.topics)
        raise NoTopicMatches(f"pipeline {cfg.name!r}: topics {patterns} match no topic in Kafka")
    if not per_topic(cfg):
        if topics == list(cfg.topics):
            return [PipelineTable(None, cfg)]
        return [PipelineTable(None, cfg.model_copy(update={"topics": topics}))]
    tables: dict[str, PipelineTable] = {}
    for topic in topics:
        one = for_topic(cfg, topic)
        name = table_name(topic, cfg.table.path)
        if name in tables:
            other = tables[name].cfg.topics[0]
            raise ConfigError(
                f"pipeline {cfg.name!r}: topics {other!r} and {topic!r} both give table {name!r} "
                f"({one.table_path}); use {{topic}} in table.path, or narrow topics"
            )
        tables[name] = PipelineTable(name, one)
    return list(tables.values())


def for_topic(cfg: PipelineConfig, topic: str) -> PipelineConfig:
    """The single-table pipeline of one topic of a per-topic pipeline: its table and quarantine paths
    rendered, its key (`write.keys`, else `write.key`)."""
    fields = {"table": topic.rsplit(".", 1)[-1], "topic": topic}
    update: dict[str, Any] = {
        "topics": [topic],
        "table": cfg.table.model_copy(
            update={
                "path": cfg.table.path.format(**fields),
                "name": cfg.table.name.format(**fields) if cfg.table.name else None,
            }
        ),
    }
    if cfg.write.upsert:
        name = table_name(topic, cfg.table.path)
        key = cfg.write.key_of(name)
        if not key:
            raise ConfigError(
                f"pipeline {cfg.name!r}: table {name!r} (topic {topic!r}) has no key: give write.key "
                f"(every table's) or write.keys.{name}"
            )
        update["write"] = cfg.write.model_copy(update={"key": key, "keys": {}})
    if cfg.quarantine is not None:
        update["quarantine"] = cfg.quarantine.model_copy(update={"path": cfg.quarantine.path.format(**fields)})
    return cfg.model_copy(update=update)


def table_path(cfg: PipelineConfig, name: str | None) -> str:
    """A table's path from its name, without Kafka (an Airflow Asset is defined when DAGs are parsed):
    the pipeline's path, or for a per-topic pipeline its template with the name filled in."""
    if not per_topic(cfg):
        if name is not None:
            raise ConfigError(f"table {name!r}: pipeline {cfg.name!r} writes one table ({cfg.table_path})")
        return cfg.table_path
    if name is None:
        raise ConfigError(f"pipeline {cfg.name!r} writes a table per topic ({cfg.table.path}): name the table")
    fields = path_placeholders(cfg.table.path)
    if fields == {"table", "topic"}:
        raise ConfigError(f"table {name!r}: {cfg.table.path} needs its topic as well; use one placeholder")
    return cfg.table.path.format(table=name, topic=name)


def pipeline_tables(cfg: PipelineConfig, topic_names: Callable[[], Iterable[str]]) -> list[PipelineTable]:
    """The pipeline's tables now. A pipeline that names its topics and writes one table needs no Kafka;
    otherwise `topic_names()` (the cluster's topics: `KafkaCluster.topic_names`) is asked once."""
    if not per_topic(cfg) and not any(is_pattern(t) for t in cfg.topics):
        return [PipelineTable(None, cfg)]
    return resolve(cfg, topic_names())


def select(tables: list[PipelineTable], cfg: PipelineConfig, name: str | None) -> list[PipelineTable]:
    """`--table NAME`: that table (refused in one line naming the known ones); None: all of them."""
    if name is None:
        return tables
    if not per_topic(cfg):
        raise ConfigError(
            f"--table {name!r}: pipeline {cfg.name!r} writes one table ({cfg.table_path}); --table is for "
            "a table.path with {table} or {topic}"
        )
    chosen = [t for t in tables if t.name == name]
    if not chosen:
        known = ", ".join(t.name or "" for t in tables)
        raise ConfigError(f"--table {name!r}: pipeline {cfg.name!r} has no such table (its tables: {known})")
    return chosen


def only_table(cfg: PipelineConfig, name: str | None, topic_names: Callable[[], Iterable[str]]) -> PipelineConfig:
    """The one table a command acts on: the pipeline's table, or `--table NAME` of a per-topic pipeline
    (where leaving it out is refused, naming the tables)."""
    tables = select(pipeline_tables(cfg, topic_names), cfg, name)
    if len(tables) > 1 or (name is None and per_topic(cfg)):
        known = ", ".join(t.name or "" for t in tables)
        raise ConfigError(
            f"pipeline {cfg.name!r} writes a table per topic ({cfg.table.path}): name one with --table "
            f"(its tables: {known})"
        )
    return tables[0].cfg

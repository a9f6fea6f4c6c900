"""Kafka: the cluster as the driver sees it (`cluster`) and the retry policy every client follows
(`retries`). Imports: config, errors."""

from offsetlake.kafka.cluster import KafkaCluster, topic_lister
from offsetlake.kafka.retries import TP, Stopped, client_settings, is_retriable, librdkafka_log, retrying

__all__ = [
    "TP",
    "KafkaCluster",
    "Stopped",
    "client_settings",
    "is_retriable",
    "librdkafka_log",
    "retrying",
    "topic_lister",
]

"""Errors a user can act on. Each message is one line that names what was wrong."""

import re


class OffsetlakeError(Exception):
    """Base class: the CLI prints str(err) on one line and exits non-zero."""


class ConfigError(OffsetlakeError):
    """A pipeline file or a command-line argument is invalid."""


class KafkaError(OffsetlakeError):
    """The broker is unreachable, a topic is unknown, or a read failed."""


class DataLossError(OffsetlakeError):
    """Offsets the ledger still needs were deleted from Kafka (retention, truncation)."""


class TableError(OffsetlakeError):
    """The Delta table is missing, unreadable, or does not match the pipeline."""


class RegistryError(OffsetlakeError):
    """The Schema Registry is unreachable or refused a request: not bad data, so the batch fails and
    nothing is committed."""


class TableMissing(TableError):
    """There is no Delta table at the path (yet)."""


class StorageError(OffsetlakeError):
    """A data file could not be written where the table lives: a full disk, a quota, permissions."""


_DECORATION = re.compile(r"\x1b\[[0-9;]*m|↳")  # delta-rs colours its nested causes and marks each with an arrow


def one_line(text: object) -> str:
    """Messages from libraries (delta-rs, librdkafka, Spark) may span lines; a terminal or task log gets one."""
    plain = _DECORATION.sub("", str(text))
    return "; ".join(line.strip() for line in plain.splitlines() if line.strip())


class CommitConflictError(OffsetlakeError):
    """Other writers kept committing first: the change gave up after this many tries, nothing written."""

    def __init__(self, what: str, attempts: int):
        super().__init__(
            f"{what}: gave up after {attempts} commit conflicts with concurrent writers; "
            f"nothing was written, run it again"
        )


class UpsertKeyError(OffsetlakeError):
    """Upsert mode: a batch cannot say which record of a key wins (the key in two partitions, no order)."""

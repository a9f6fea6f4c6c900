"""Errors a user can act on. Each message is one line that names what was wrong."""

import re


class OffsetlakeError(Exception):
    """Base class: the CLI prints str(err) on one line and exits non-zero."""

    code = "error"


class ConfigError(OffsetlakeError):
    """A pipeline file or a command-line argument is invalid."""

    code = "config"


class KafkaError(OffsetlakeError):
    """The broker is unreachable, a topic is unknown, or a read failed."""

    code = "kafka"


class DataLossError(OffsetlakeError):
    """Offsets the ledger still needs were deleted from Kafka (retention, truncation)."""

    code = "data-loss"


class TableError(OffsetlakeError):
    """The Delta table is missing, unreadable, or does not match the pipeline."""

    code = "table"


class RegistryError(OffsetlakeError):
    """The Schema Registry is unreachable or refused a request: not bad data, so the batch fails and
    nothing is committed."""

    code = "registry"


class TableMissing(TableError):
    """There is no Delta table at the path (yet)."""

    code = "table-missing"


class RewindOutOfReach(TableError):
    """A RESTORE by another writer took the table back to a version whose log entry log clean-up has removed
    since, before any commit recorded the ledger as of that version: it cannot be read now."""

    code = "rewind-out-of-reach"


class StorageError(OffsetlakeError):
    """A data file could not be written where the table lives: a full disk, a quota, permissions."""

    code = "storage"


_DECORATION = re.compile(r"\x1b\[[0-9;]*m|↳")  # delta-rs colours its nested causes and marks each with an arrow


def one_line(text: object) -> str:
    """Messages from libraries (delta-rs, librdkafka, Spark) may span lines; a terminal or task log gets one."""
    plain = _DECORATION.sub("", str(text))
    return "; ".join(line.strip() for line in plain.splitlines() if line.strip())


class CommitConflictError(OffsetlakeError):
    """Other writers kept committing first: the change gave up after this many tries, nothing written."""

    code = "commit-conflict"

    def __init__(self, what: str, attempts: int):
        super().__init__(
            f"{what}: gave up after {attempts} commit conflicts with concurrent writers; "
            f"nothing was written, run it again"
        )


class UpsertKeyError(OffsetlakeError):
    """Upsert mode: a batch cannot say which record of a key wins (the key in two partitions, no order)."""

    code = "upsert-key"


# An error raised in a Spark task reaches the driver as the text of Spark's own exception. Its kind travels
# in that text as a code -- `[offsetlake-error:table-missing] no Delta table at ...` -- that the driver maps
# back to the class (`from_wire`), subclasses included.
_WIRE = re.compile(r"\[offsetlake-error:([a-z-]+)\] ([^\n]*)")


def _kinds() -> dict[str, type[OffsetlakeError]]:
    """Each code to the class that defines it; a subclass without a code of its own travels as its parent."""
    found: dict[str, type[OffsetlakeError]] = {}
    pending: list[type[OffsetlakeError]] = [OffsetlakeError]
    while pending:
        cls = pending.pop()
        if "code" in vars(cls):
            found.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    return found


def to_wire(err: OffsetlakeError) -> str:
    """One line that carries `err`'s kind and message across Spark."""
    return f"[offsetlake-error:{err.code}] {one_line(err)}"


def from_wire(text: str) -> OffsetlakeError | None:
    """The error a task raised, from the text Spark reports it in; None when none of ours is in it."""
    match = _WIRE.search(text)
    if match is None:
        return None
    cls = _kinds().get(match.group(1), OffsetlakeError)
    error = cls.__new__(cls)  # not cls(message): a kind's own __init__ builds its message (CommitConflictError)
    Exception.__init__(error, match.group(2).strip())
    return error

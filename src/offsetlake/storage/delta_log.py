"""One commit of a table's Delta log, read as its actions: the one place offsetlake reads a commit file.

delta-rs answers for the table as a whole (its snapshot, its history); some questions are about one commit:
which files it added, what it counted, which `txn` actions it wrote. Those read the commit's file, one
request, instead of asking delta-rs to replay the log.
"""

from __future__ import annotations

import json
from typing import Any

from offsetlake.storage.location import Location, retrying

# Delta drops `txn` actions older than this at a checkpoint: a table that sets it would forget the ledger.
LEDGER_EXPIRING_PROPERTY = "delta.setTransactionRetentionDuration"

Action = dict[str, Any]  # one line of a commit file: {"add": {...}}, {"txn": {...}}, {"commitInfo": {...}}...


def commit_file(root: str, version: int) -> str:
    """The path of version `version`'s commit file under the table's root in its store."""
    return f"{root.rstrip('/')}/_delta_log/{version:020d}.json"


def commit_actions(location: Location, version: int) -> list[Action] | None:
    """The actions of commit `version`, in the file's order; None once log clean-up removed its file (the
    newest checkpoint then holds the table's state, not which commit did what). An object store's transient
    answers are asked again (`retrying`)."""
    fs, root = location.filesystem()
    path = commit_file(root, version)

    def read() -> list[Action] | None:
        try:
            with fs.open_input_stream(path) as stream:
                lines = stream.read().decode().splitlines()
        except FileNotFoundError:
            return None
        return [json.loads(line) for line in lines if line.strip()]

    return retrying(location, read)


def commit_exists(location: Location, version: int) -> bool:
    """Whether commit `version`'s file is there. Opening it costs an object store one HEAD; asking for its
    file info, a HEAD and then a listing (is it a directory?) when it is not there."""
    fs, root = location.filesystem()
    path = commit_file(root, version)

    def opens() -> bool:
        try:
            fs.open_input_stream(path).close()
        except FileNotFoundError:
            return False
        return True

    return retrying(location, opens)


def txn_versions_in(actions: list[Action]) -> dict[str, int]:
    """{app id: version} of the commit's `txn` actions."""
    return {a["txn"]["appId"]: int(a["txn"]["version"]) for a in actions if "txn" in a}

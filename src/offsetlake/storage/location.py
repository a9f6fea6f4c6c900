"""Where a table lives and how to reach it, as one value passed to whatever opens, reads or writes it.

A `Location` is a table's URI with its object-store options (endpoint, region, credentials, retry bound).
It is made from the pipeline's configuration (`PipelineConfig.table_location`), after the credentials of
an Airflow connection have been merged into it (`offsetlake.config.connections`), and it travels with the
pipeline into Spark's executors. Nothing is looked up on the side: a location without options uses the
store's defaults because it was given none.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import pyarrow.fs as pafs

if TYPE_CHECKING:
    from deltalake import DeltaTable

T = TypeVar("T")
S3_SCHEMES = ("s3://", "s3a://")
_SECRET_HINTS = ("secret", "token", "password", "credential")


@dataclass(frozen=True)
class Location:
    """A table's URI and the storage options every reader and writer of it is given."""

    uri: str
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, uri: str, options: Mapping[str, str] | None = None) -> Location:
        return cls(uri, tuple(sorted((options or {}).items())))

    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:
        shown = {k: ("***" if any(h in k.lower() for h in _SECRET_HINTS) else v) for k, v in self.options}
        return f"Location({self.uri!r}, {shown})"

    @property
    def storage_options(self) -> dict[str, str] | None:
        """What delta-rs takes as `storage_options` (None: the store's defaults)."""
        return dict(self.options) or None

    @property
    def is_object_store(self) -> bool:
        return "://" in self.uri and not self.uri.startswith("file://")

    @property
    def retry_seconds(self) -> float:
        """The retry bound of an object-store table (its delta-rs `retry_timeout`); 0 locally."""
        return parse_duration(dict(self.options).get("retry_timeout", "0s"))

    def delta_table(self, version: int | None = None) -> DeltaTable:
        from deltalake import DeltaTable

        return DeltaTable(self.uri, version=version, storage_options=self.storage_options)

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """pyarrow's file system for the table and the table's root path in it, with the table's options
        (S3: endpoint, region, credentials, plain HTTP) when it has any."""
        if not self.options or not self.uri.startswith(S3_SCHEMES):
            fs, root = pafs.FileSystem.from_uri(self.uri)
            return fs, root
        given = {k.lower(): v for k, v in self.options}
        endpoint = given.get("aws_endpoint_url") or given.get("aws_endpoint") or given.get("endpoint")
        settings: dict[str, str] = {}
        if endpoint:
            scheme, _, host = endpoint.rpartition("://")
            settings.update(endpoint_override=host, scheme=scheme or "https")
        fs = pafs.S3FileSystem(
            # A file is sent when it is closed: one PutObject for a data file, not the three requests of a
            # multipart upload (CreateMultipartUpload, UploadPart, Complete) that an eager open starts.
            allow_delayed_open=True,
            access_key=given.get("aws_access_key_id"),
            secret_key=given.get("aws_secret_access_key"),
            session_token=given.get("aws_session_token"),
            region=given.get("aws_region") or given.get("region") or "us-east-1",
            **settings,
        )
        return fs, self.uri.split("://", 1)[1].rstrip("/")


def parse_duration(text: str) -> float:
    """object_store's durations (`90s`, `500ms`, `2m`) in seconds; 0 for what it is not."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not match:
        return 0.0
    return float(match.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2) or "s"]


def retrying(location: Location, call: Callable[[], T], errors: tuple[type[Exception], ...] = (OSError,)) -> T:
    """`call()` -- pyarrow on the table's store -- asked again while the store gives an answer that may change
    soon (a 503, throttling, refused or reset connections), until the table's retry bound: the same bound
    delta-rs gets as `retry_timeout`, so the driver's own reads and the executors' writes ride out the same
    outage its commits do. Other errors, and every error on a local table (bound 0), are raised at once.
    `call` must be safe to repeat (a read, a listing, an idempotent delete, a write of a unique name).
    `errors`: the exception types that may carry such an answer (delta-rs raises some as DeltaError)."""
    deadline = time.monotonic() + location.retry_seconds
    pause = 0.5
    while True:
        try:
            return call()
        except errors as err:
            if not is_transient(err) or time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 10.0)


def despite_log_cleanup(read: Callable[[], T], tries: int = 5) -> T:
    """`read()` -- delta-rs loading a table or reading its history -- asked again when a file of the log
    vanished between delta-rs listing the log and reading the file: log clean-up (offsetlake's `cleanup`,
    or another engine's) deletes commit files older than the newest checkpoint, and a read that listed them
    just before finds them gone (seen on S3, where listing and reading are requests apart). Listed again,
    the log starts at that checkpoint. Only a vanished `_delta_log/` file is asked again: locally delta-rs
    raises FileNotFoundError; from S3 a DeltaError ("Object at location .../_delta_log/...checkpoint.parquet
    not found ... 404", met by a stream while the checkpoint fault cleaned the log up)."""
    for attempt in range(tries):
        try:
            return read()
        except Exception as err:
            if not _vanished_log_file(err) or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


_NOT_FOUND = re.compile(r"not found|NoSuchKey|No such file", re.IGNORECASE)


def _vanished_log_file(err: Exception) -> bool:
    text = str(err)
    if "_delta_log/" not in text:
        return False
    return isinstance(err, FileNotFoundError) or bool(_NOT_FOUND.search(text))


# What an object store answers when it will not say yes now but may soon: throttling, a server error, a
# connection refused or reset, a timeout. Not retried: access denied, no such bucket, a full local disk.
# pyarrow names the AWS SDK's error kind (`AWS Error SLOW_DOWN during CreateMultipartUpload operation`), often
# without the HTTP status; S3 and delta-rs use the XML codes (SlowDown).
_RETRIABLE = re.compile(
    r"HTTP (response code:|status) (5\d\d|429)|SLOW_?DOWN|SERVICE_?UNAVAILABLE|INTERNAL_?(ERROR|FAILURE)|"
    r"THROTTLING|REQUEST_?TIMEOUT|NETWORK_CONNECTION|curlCode: (6|7|28|52|55|56)|"
    r"Couldn't connect|Could not connect|Connection refused|Connection reset|timed out|Timeout",
    re.IGNORECASE,
)


def is_transient(err: Exception) -> bool:
    """The store's answer may change soon (see _RETRIABLE): asking again is worth it."""
    return bool(_RETRIABLE.search(str(err)))


def delete_if_there(fs: pafs.FileSystem, path: str) -> None:
    """Delete `path`; already gone is fine (an earlier try whose answer the store lost may have deleted it)."""
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass

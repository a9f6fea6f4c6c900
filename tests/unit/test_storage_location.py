"""Which object-store errors the driver's and executors' pyarrow calls retry, and for how long (pure logic;
the retries themselves against a store answering 503 or away are in integration/test_object_storage.py and
the S3 chaos run)."""

from __future__ import annotations

import pytest

from offsetlake.storage import location as storage_location
from offsetlake.storage.location import Location, is_transient, retrying


@pytest.mark.parametrize(
    "message, retried",
    [
        # pyarrow's words for a store that is busy or away: retried until table.retry_seconds
        ("When testing for existence of bucket 'lake': AWS Error UNKNOWN (HTTP status 503) during HeadBucket", True),
        ("AWS Error SLOW_DOWN during PutObject operation: HTTP response code: 503", True),
        ("AWS Error NETWORK_CONNECTION during PutObject operation: curlCode: 7, Couldn't connect to server", True),
        ("AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Could not connect to server", True),
        # pyarrow names the SDK's error kind and not the status (found by the S3 chaos run, seed 893277)
        (
            "When initiating multiple part upload for key 'part-0.parquet' in bucket 'lake': AWS Error SLOW_DOWN "
            "during CreateMultipartUpload operation: Please reduce your request rate.",
            True,
        ),
        ("AWS Error SERVICE_UNAVAILABLE during GetObject operation", True),
        # delta-rs' object store: a put whose connection the store reset (a chaos run's stream, seed 288534)
        (
            "Generic S3 error: Error performing PUT http://127.0.0.1:1/lake/t/_delta_log/00000000000000000000.json "
            "in 375µs - HTTP error: error sending request: connection error: Connection reset by peer (os error 104)",
            True,
        ),
        # a refusal that waiting does not change: at once
        ("AWS Error ACCESS_DENIED during PutObject operation: HTTP response code: 403", False),
        ("Error writing bytes to file. Detail: [errno 28] No space left on device", False),
    ],
)
def test_a_busy_or_absent_store_is_retried_and_a_refusal_is_not(message, retried):
    assert is_transient(OSError(message)) is retried


def test_the_retry_bound_is_the_locations_retry_timeout():
    assert Location.of("s3://bucket/retry-table", {"retry_timeout": "90s"}).retry_seconds == 90
    assert Location.of("s3://bucket/retry-table", {"retry_timeout": "500ms"}).retry_seconds == 0.5
    assert Location.of("/local/table").retry_seconds == 0


def test_a_location_is_a_value_that_never_shows_its_secrets():
    options = {"AWS_SECRET_ACCESS_KEY": "pw-s3", "AWS_REGION": "us-east-2"}
    location = Location.of("s3://lake/t", options)
    assert location == Location.of("s3://lake/t", dict(reversed(options.items())))  # the order does not matter
    assert hash(location) == hash(Location.of("s3://lake/t", options))  # a key of AttemptFiles
    assert str(location) == "s3://lake/t" and "pw-s3" not in repr(location) and "us-east-2" in repr(location)
    assert location.storage_options == options and Location.of("/t").storage_options is None


class _Store:
    """Answers `failures` errors with `message`, then "ok"."""

    def __init__(self, failures: int, message: str) -> None:
        self.failures, self.message, self.calls = failures, message, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise OSError(self.message)
        return "ok"


@pytest.fixture
def no_sleep(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(storage_location.time, "sleep", slept.append)
    return slept


def test_a_store_away_for_a_while_is_asked_again_with_growing_pauses(no_sleep):
    away = Location.of("s3://bucket/away-table", {"retry_timeout": "60s"})
    store = _Store(3, "curlCode: 7, Could not connect to server")
    assert retrying(away, store) == "ok"
    assert store.calls == 4 and no_sleep == [0.5, 1.0, 2.0]


def test_a_store_away_past_the_bound_raises_its_own_error(no_sleep):
    bounded = Location.of("s3://bucket/bounded-table", {"retry_timeout": "3s"})
    store = _Store(100, "AWS Error UNKNOWN (HTTP status 503) during HeadObject")
    with pytest.raises(OSError, match="HTTP status 503"):
        retrying(bounded, store)
    assert no_sleep == [0.5, 1.0, 2.0]  # the next pause (4 s) would pass the 3 s bound


@pytest.mark.parametrize("uri", ["s3://bucket/denied-table", "/local/table"])
def test_a_refusal_or_a_local_error_is_raised_at_once(uri, no_sleep):
    location = Location.of(uri, {"retry_timeout": "60s"} if uri.startswith("s3") else {})
    message = "HTTP response code: 403" if uri.startswith("s3") else "curlCode: 7, Could not connect"
    store = _Store(1, message)
    with pytest.raises(OSError):
        retrying(location, store)
    assert store.calls == 1 and no_sleep == []


def test_a_log_file_vanished_under_a_read_is_read_again_and_nothing_else_is():
    from offsetlake.storage.location import despite_log_cleanup

    calls = []

    def read(errors):
        def call():
            calls.append(1)
            if errors:
                raise errors.pop(0)
            return "table"

        return call

    gone = FileNotFoundError("Object at location lake/t/_delta_log/00000000000000000078.json not found")
    assert despite_log_cleanup(read([gone, gone])) == "table" and len(calls) == 3
    with pytest.raises(FileNotFoundError, match="part-0.parquet"):  # a data file: not the log's race
        despite_log_cleanup(read([FileNotFoundError("Object at location lake/t/part-0.parquet not found")]))
    with pytest.raises(FileNotFoundError):  # gone every time: the error stands
        despite_log_cleanup(read([gone] * 5), tries=5)
    from deltalake.exceptions import DeltaError

    # From S3, delta-rs names a vanished checkpoint in a DeltaError (seen in a chaos run's stream).
    checkpoint = DeltaError(
        "Kernel error: Arrow error: External: Object at location t/_delta_log/00000000000000000104.checkpoint.parquet"
        " not found: Error performing GET ... 404 Not Found: <Code>NoSuchKey</Code>"
    )
    calls.clear()
    assert despite_log_cleanup(read([checkpoint])) == "table" and len(calls) == 2
    with pytest.raises(DeltaError, match="Invalid table version"):  # not a vanished file
        despite_log_cleanup(read([DeltaError("Invalid table version: 3 (t/_delta_log/)")]))

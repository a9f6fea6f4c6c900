"""Which object-store errors an executor's Parquet write retries (pure logic; the retries themselves
against a store answering 503 are in integration/test_object_storage.py and the S3 chaos run)."""

from __future__ import annotations

import pytest

from offsetlake.files import _retriable, register_storage, retry_seconds


@pytest.mark.parametrize(
    "message, retried",
    [
        # pyarrow's words for a store that is busy or away: retried until table.retry_seconds
        ("When testing for existence of bucket 'lake': AWS Error UNKNOWN (HTTP status 503) during HeadBucket", True),
        ("AWS Error SLOW_DOWN during PutObject operation: HTTP response code: 503", True),
        ("AWS Error NETWORK_CONNECTION during PutObject operation: curlCode: 7, Couldn't connect to server", True),
        # a refusal that waiting does not change: at once
        ("AWS Error ACCESS_DENIED during PutObject operation: HTTP response code: 403", False),
        ("Error writing bytes to file. Detail: [errno 28] No space left on device", False),
    ],
)
def test_a_busy_or_absent_store_is_retried_and_a_refusal_is_not(message, retried):
    assert _retriable(OSError(message)) is retried


def test_the_retry_bound_is_the_tables_registered_retry_timeout():
    register_storage("s3://bucket/retry-table", {"retry_timeout": "90s"})
    assert retry_seconds("s3://bucket/retry-table/part-1.parquet") == 90
    assert retry_seconds("/local/table") == 0

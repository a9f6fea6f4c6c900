"""The `.crc` Hadoop's local file system (Spark, delta-spark) writes beside `_last_checkpoint` is removed once
delta-rs has rewritten that file, and kept while it still matches."""

from __future__ import annotations

import struct
import zlib

from offsetlake.storage.hadoop_checksums import drop_stale_checksums, matches
from offsetlake.storage.location import Location


def hadoop_checksum(data: bytes, chunk: int = 512) -> bytes:
    """What Hadoop's ChecksumFileSystem writes: the magic, the bytes per checksum, a CRC-32 per chunk."""
    sums = (struct.pack(">I", zlib.crc32(data[i : i + chunk])) for i in range(0, len(data), chunk))
    return b"crc\0" + struct.pack(">i", chunk) + b"".join(sums)


def a_log(tmp_path, checkpoint: bytes, checksum: bytes | None):
    log = tmp_path / "table" / "_delta_log"
    log.mkdir(parents=True)
    (log / "_last_checkpoint").write_bytes(checkpoint)
    if checksum is not None:
        (log / "._last_checkpoint.crc").write_bytes(checksum)
    return Location(str(tmp_path / "table")), log / "._last_checkpoint.crc"


SPARKS = b'{"version":10,"size":12,"sizeInBytes":4096,"numOfAddFiles":9}' * 20  # more than one chunk
DELTA_RS = b'{"version":100,"size":140,"parts":null,"sizeInBytes":90210,"numOfAddFiles":120}'


def test_a_checksum_that_matches_its_file_is_kept(tmp_path):
    location, crc = a_log(tmp_path, SPARKS, hadoop_checksum(SPARKS))
    drop_stale_checksums(location)
    assert crc.read_bytes() == hadoop_checksum(SPARKS)


def test_a_checksum_left_by_spark_is_removed_once_delta_rs_rewrote_the_file(tmp_path):
    location, crc = a_log(tmp_path, DELTA_RS, hadoop_checksum(SPARKS))
    drop_stale_checksums(location)
    assert not crc.exists()
    assert (crc.parent / "_last_checkpoint").read_bytes() == DELTA_RS


def test_no_checksum_or_no_checkpoint_is_left_as_it_is(tmp_path):
    location, crc = a_log(tmp_path, DELTA_RS, None)
    drop_stale_checksums(location)
    assert not crc.exists()
    drop_stale_checksums(Location(str(tmp_path / "no-table")))


def test_the_checksum_format_is_hadoops():
    assert matches(SPARKS, hadoop_checksum(SPARKS))
    assert matches(SPARKS, hadoop_checksum(SPARKS, chunk=64))  # io.bytes.per.checksum is a setting
    assert not matches(SPARKS, hadoop_checksum(SPARKS)[:-4])
    assert not matches(DELTA_RS, hadoop_checksum(SPARKS))
    assert not matches(SPARKS, b"not a checksum")

"""Hadoop's checksum files beside a Delta log on a file system, kept true when delta-rs rewrites a file.

Spark (delta-spark among its writers) writes a local or NFS table through Hadoop's checksummed local file
system, which puts a `.<name>.crc` beside each file it writes: `crc\\0`, the bytes per checksum, then one
CRC-32 per chunk. Every file of a Delta log is written once, but `_last_checkpoint`, which names the
newest checkpoint, is rewritten in place by whichever engine writes a checkpoint. delta-rs writes no
checksum, so once it has rewritten `_last_checkpoint` the `.crc` Spark left beside it no longer matches, and
every Spark reader of the table then fails to parse the file, sleeps and tries again three times, logs a
stack trace each time, and lists the log to find the checkpoint itself. Where the `.crc` is not there,
Hadoop reads the file unchecked: so after delta-rs may have written a checkpoint, a `.crc` that no longer
matches its file is removed.
"""

from __future__ import annotations

import logging
import struct
import zlib
from pathlib import Path

from offsetlake.storage.location import Location

MAGIC = b"crc\0"
REWRITTEN_IN_PLACE = "_last_checkpoint"

log = logging.getLogger("offsetlake.storage.hadoop_checksums")


def drop_stale_checksums(location: Location) -> None:
    """Remove the `.crc` of the table's `_last_checkpoint` if it does not match the file (see the module
    docstring). Object stores keep no such files: nothing to do there."""
    if location.is_object_store:
        return
    data = Path(location.uri.removeprefix("file://")) / "_delta_log" / REWRITTEN_IN_PLACE
    checksum = data.with_name(f".{data.name}.crc")
    try:
        expected = checksum.read_bytes()  # first: most tables have none (delta-rs alone wrote them)
        if matches(data.read_bytes(), expected):
            return
        checksum.unlink()
    except FileNotFoundError:  # no checksum, no checkpoint yet, or another writer's rename in between
        return
    log.info("removed %s: it no longer matched the file delta-rs rewrote", checksum)


def matches(data: bytes, checksum: bytes) -> bool:
    """Whether Hadoop's checksum file `checksum` is the checksum of `data`."""
    if len(checksum) < 8 or checksum[:4] != MAGIC:
        return False
    (chunk,) = struct.unpack(">i", checksum[4:8])
    if chunk <= 0:
        return False
    expected = [zlib.crc32(data[i : i + chunk]) for i in range(0, len(data), chunk)]
    return checksum[8:] == b"".join(struct.pack(">I", crc) for crc in expected)

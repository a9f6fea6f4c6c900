"""The C allocator of a process that reads Kafka: one heap, and the pages a range freed kept for the next.

A reader's bytes pass through glibc's malloc twice: librdkafka's fetch responses (up to 16 MiB each, made in
its own threads) and every message's value (confluent-kafka copies each into a Python `bytes`). By default
glibc gives a freed block of more than 128 KiB, and the freed top of a heap, back to the kernel, and the
next range touches fresh pages: a page fault each, a large part of reading records of a few kilobytes
(docs/development/measurements.md). Here every thread allocates from the one main heap (each of
librdkafka's threads would otherwise have a heap of its own, each keeping its own freed memory), blocks
of up to `MMAP_THRESHOLD_BYTES` come from it, and up to `KEPT_BYTES` freed at its top stay with the process.
A worker reading one range after another then reuses the pages the last range freed, and what it keeps
between ranges is bounded by `KEPT_BYTES`, whatever the number of ranges or consumers it has made.

Arrow's memory pool (mimalloc, for the chunks' columns) backs its arenas with transparent huge pages, so the
first touch of any part of 2 MiB makes the kernel zero all of it, and it gives a freed page back to the
kernel 10 ms after it was freed, so a range's next chunk, tens of milliseconds later, gets fresh pages: the
kernel zeroing them was a third of a change data capture worker's CPU. Unless the environment says
otherwise, mimalloc is asked for ordinary pages (`MIMALLOC_ALLOW_THP=0`) and to keep freed pages
`POOL_PURGE_DELAY_MS` (`MIMALLOC_PURGE_DELAY`); it reads both when it first needs them.

A worker's first range still found its heap small: every page of what the range and the next one's reader
hold faulted in during that range. `touch_heap` grows the heap to `WARM_HEAP_BYTES` and frees it, kept, in
the session's warm-up job (offsetlake/spark/prewarm.py), while the session is still being built.

glibc keeps the arenas threads made before the settings, and a thread started later may still be given one
of them (each of which hands whole heaps back once they are empty): so the settings are made where a process
that reads starts, before it has a thread (offsetlake.spark.daemon and .prewarm, whose forks are Spark's
Python workers), and again in the reader for any other process (the driver reading a small batch).
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest on 64-bit: a fetch response is a block of the heap
KEPT_BYTES = 256 << 20
# About what a worker's heap grows to while it reads a range of the default size and opens the next.
WARM_HEAP_BYTES = 96 << 20
_TOUCH_BLOCK_BYTES = 4 << 20  # below MMAP_THRESHOLD_BYTES: a block of the heap, kept there once freed
POOL_PURGE_DELAY_MS = 2000  # Arrow's pool: longer than between a range's chunks, short enough to give back


@functools.cache
def keep_freed_memory() -> bool:
    """Set once per process (before its first consumer); whether glibc took the settings. Elsewhere than
    glibc the allocator is left as it is (Arrow's pool's delay is set everywhere)."""
    os.environ.setdefault("MIMALLOC_ALLOW_THP", "0")
    os.environ.setdefault("MIMALLOC_PURGE_DELAY", str(POOL_PURGE_DELAY_MS))
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES), (_M_TRIM_THRESHOLD, KEPT_BYTES))
    return all([mallopt(parameter, value) == 1 for parameter, value in settings])


def touch_heap(size: int = WARM_HEAP_BYTES) -> bool:
    """Grow this process's heap by about `size` bytes, touch every page and free it again: with the settings
    of `keep_freed_memory` the pages stay with the process, and what it allocates next reuses them instead of
    faulting them in. Whether it did (not where the settings were refused: freed, the pages would go back)."""
    if not keep_freed_memory() or size > KEPT_BYTES:
        return False
    libc = ctypes.CDLL(None)
    libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    libc.free.argtypes, libc.free.restype = [ctypes.c_void_p], None
    blocks = [libc.malloc(_TOUCH_BLOCK_BYTES) for _ in range(size // _TOUCH_BLOCK_BYTES)]
    try:
        for block in blocks:
            if block:
                ctypes.memset(block, 0, _TOUCH_BLOCK_BYTES)
    finally:
        for block in reversed(blocks):  # the top last: the freed blocks join into one, at the heap's top
            libc.free(block)
    return True

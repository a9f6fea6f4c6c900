"""The reader's allocator settings (offsetlake/spark/allocator.py), in processes of their own: the pages one
range freed serve the next, from the main thread as from librdkafka's, which glibc's defaults give back."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc's")

# A range's values (20,000 of 3,400 bytes, as a backlog of Debezium events with schemas) made, freed, and
# made again; the page faults of the second making counted. `first_made_in`: the thread that made the first.
SCRIPT = """
import json, resource, sys, threading
from offsetlake.spark.allocator import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "kept" else False
def values():
    return [bytes([i % 251]) * 3400 for i in range(20_000)]
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
if sys.argv[2] == "thread":  # made and freed in another thread, as librdkafka's fetch responses are
    worker = threading.Thread(target=lambda: values())
    worker.start(); worker.join()
else:
    first = values(); del first
before = faults()
second = values()
print(json.dumps({"kept": kept, "faults": faults() - before}))
"""
PAGES = 20_000 * 3_400 // 4096


def faults_of_second_range(mode: str, first_made_in: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, first_made_in], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(done.stdout)


@pytest.mark.parametrize("first_made_in", ["main", "thread"])
def test_a_second_range_reuses_the_pages_the_first_freed(first_made_in):
    default = faults_of_second_range("default", first_made_in)
    kept = faults_of_second_range("kept", first_made_in)
    assert kept["kept"] is True
    assert default["faults"] > PAGES // 2, default  # glibc's defaults give the pages back: the test can fail
    assert kept["faults"] < PAGES // 10, (kept, default)


# Arrow's pool (mimalloc) with the settings and without: two chunks' buffers made, touched, freed and made
# again; how much of them the kernel backed with huge pages, and the page faults of the second making.
POOL_SCRIPT = """
import json, re, resource, sys
if sys.argv[1] == "kept":
    from offsetlake.spark.allocator import keep_freed_memory
    keep_freed_memory()
import numpy as np, pyarrow as pa, time
def chunk():
    buffers = [pa.allocate_buffer(48 << 20) for _ in range(2)]
    for b in buffers:
        np.frombuffer(b, np.uint8)[:] = 1
    return buffers
first = chunk(); del first
time.sleep(0.2)  # longer than mimalloc's default purge delay (10 ms)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
second = chunk()
huge = sum(int(k) for k in re.findall(r"AnonHugePages:\\s+(\\d+) kB", open("/proc/self/smaps").read()))
print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, "huge_kb": huge}))
"""


def pool_of_second_chunk(mode: str) -> dict:
    # mimalloc's own defaults: this process may have made the settings (the reader makes them) for its children
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIMALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", POOL_SCRIPT, mode], capture_output=True, text=True, check=True, timeout=60, env=env
    )
    return json.loads(done.stdout)


def test_arrows_pool_keeps_ordinary_pages_for_the_next_chunk():
    kept = pool_of_second_chunk("kept")
    assert kept["huge_kb"] < 4096, kept  # no chunk in huge pages (each first touch would zero 2 MiB)
    assert kept["faults"] < 2 * (48 << 20) // 4096 // 10, kept  # the second chunk reuses the first's pages
    default = pool_of_second_chunk("default")
    if "[never]" not in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text():
        assert default["huge_kb"] >= 4096, default  # mimalloc asks for huge pages by default: the test can fail


# A first range's values (15,000 of 3,400 bytes) made in a process whose heap was, or was not, touched
# beforehand (as a worker's is in the session's warm-up job); the page faults of that making counted.
TOUCH_SCRIPT = """
import json, resource, sys
from offsetlake.spark.allocator import keep_freed_memory, touch_heap
keep_freed_memory()
touched = touch_heap(64 << 20) if sys.argv[1] == "touched" else False
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
first = [bytes([i % 251]) * 3400 for i in range(15_000)]
print(json.dumps({"touched": touched, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""
FIRST_PAGES = 15_000 * 3_400 // 4096


def faults_of_first_range(mode: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", TOUCH_SCRIPT, mode], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(done.stdout)


def test_a_touched_heap_serves_the_first_range_without_faults():
    untouched = faults_of_first_range("untouched")
    touched = faults_of_first_range("touched")
    assert touched["touched"] is True
    assert untouched["faults"] > FIRST_PAGES // 2, untouched  # a fresh heap faults its pages in: it can fail
    assert touched["faults"] < FIRST_PAGES // 10, (touched, untouched)

"""Spark's Python daemon (`spark.python.daemon.module`): forked ready by the driver's prewarmed process
(offsetlake/spark/prewarm.py) when there is one, else started here without Spark's own archives on sys.path.

Spark puts `pyspark.zip`, `py4j-*-src.zip` and the spark-core jar first on every Python worker's path,
and before each task the worker calls `importlib.invalidate_caches()`, which makes every zip importer
read its archive's whole directory again (thousands of entries in pyspark.zip and the jar): the largest
cost of a warm batch after reading Kafka (docs/development/measurements.md).
Where pyspark is installed in this Python (pip, as offsetlake requires), the archives hold the same
code, so the daemon and the workers it forks import pyspark from the installation and no zip importer
is left to re-read. Where it is not, nothing changes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path

from offsetlake.spark.allocator import keep_freed_memory

PREWARMED_ENV = "OFFSETLAKE_SPARK_PREWARMED"  # the socket of the driver's prewarmed process (prewarm.py)
BIND_WAIT_SECONDS = 2.0  # an interpreter binds at once; a JVM takes seconds to ask (docs/development/measurements.md)


def _is_spark_archive(entry: str) -> bool:
    """pyspark.zip, py4j-*-src.zip, and the spark-core jar Spark adds too (SparkContext.jarOfObject)."""
    name = os.path.basename(entry)
    return (name.endswith(".zip") and name.startswith(("pyspark.zip", "py4j-"))) or name.endswith(".jar")


def drop_spark_archives() -> None:
    """Leave Spark's archives off sys.path when pyspark and py4j import without them."""
    kept = [entry for entry in sys.path if not _is_spark_archive(entry)]
    if len(kept) == len(sys.path):
        return
    everything = sys.path[:]
    sys.path[:] = kept
    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("py4j") is None:
        sys.path[:] = everything
        return
    dropped = tuple(set(everything) - set(kept))
    for entry in [e for e in sys.path_importer_cache if e.startswith(dropped)]:  # made while finding this module
        del sys.path_importer_cache[entry]


def quiet_on_closed_socket(worker):
    """pyspark.daemon's `worker`, returning 1 (this worker exits, as it would for any failure) instead
    of raising when its JVM has closed the socket: a stopping session closes its idle workers' sockets,
    and over a Unix socket (spark.py) a worker that still had bytes to flush then printed a BrokenPipe
    traceback, in about one session stop of eight. Nobody is left to read what it had to say."""

    def run(sock, authenticated):
        try:
            return worker(sock, authenticated)
        except BrokenPipeError:
            return 1

    return run


def hand_over(address: str) -> int | None:
    """Ask the prewarmed process at `address` (offsetlake/spark/prewarm.py) to fork the daemon on this
    process's standard streams; return the daemon's pid, or None when there is no such process or it
    refused (this process then starts the daemon itself)."""
    request = {
        "executable": os.path.realpath(sys.executable),
        "path": sys.path,
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
    }
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            _connect(conn, address)
            payload = json.dumps(request).encode()
            socket.send_fds(conn, [payload[:1]], [0, 1, 2])  # one byte: sent whole, with the descriptors
            conn.sendall(payload[1:])
            conn.shutdown(socket.SHUT_WR)
            answer = read_to_end(conn).decode()
    except OSError:
        return None  # no such process (it ended with its driver, or the session is on another host)
    if not answer.isdigit():
        print(f"offsetlake: Spark's Python daemon starts afresh: the prewarmed process {answer}", file=sys.stderr)
        return None
    return int(answer)


def _connect(conn: socket.socket, address: str) -> None:
    """Connect; while the process is still starting (its directory is there, its socket not yet) wait
    for the socket up to BIND_WAIT_SECONDS. A process that ended took its directory with it."""
    deadline = time.monotonic() + BIND_WAIT_SECONDS
    while True:
        try:
            return conn.connect(address)
        except FileNotFoundError:
            if not Path(address).parent.is_dir() or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def wait_for(pid: int) -> None:
    """Stand in for the daemon `pid` until it exits: the JVM watches this process, and stops the daemon
    with SIGTERM to it."""
    signal.signal(signal.SIGTERM, lambda *_: _signal(pid, signal.SIGTERM))
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:  # no pidfd here (Linux < 5.3): look every 100 ms
        while _signal(pid, 0):
            time.sleep(0.1)
        return
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(pidfd, selectors.EVENT_READ)
            while not selector.select():  # readable once the process has exited
                pass
    finally:
        os.close(pidfd)


def _signal(pid: int, number: int) -> bool:
    try:
        os.kill(pid, number)
        return True
    except ProcessLookupError:
        return False


def read_to_end(conn: socket.socket) -> bytes:
    chunks = []
    while chunk := conn.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def run() -> None:
    """pyspark's daemon, its workers quiet on a closed socket (in this process, or forked by prewarm.py)."""
    from pyspark import daemon

    daemon.worker = quiet_on_closed_socket(daemon.worker)
    daemon.manager()


def main() -> None:
    """What Spark runs as its Python daemon: handed over to the driver's prewarmed process when there is
    one that takes it (offsetlake/spark/prewarm.py), else pyspark's daemon in this process."""
    address = os.environ.get(PREWARMED_ENV)
    if address:
        pid = hand_over(address)
        if pid is not None:
            wait_for(pid)
            return
    keep_freed_memory()  # before pyspark's daemon and any thread: the workers it forks read Kafka
    drop_spark_archives()
    run()


if __name__ == "__main__":
    main()

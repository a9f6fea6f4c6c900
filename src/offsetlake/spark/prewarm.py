"""A Python process, started with a local Spark session, that forks Spark's Python daemon ready to work.

The first Spark job of a session waited for Spark to start its Python daemon (a new interpreter that
imports pyspark) and then for each Python worker the daemon forks to import the task code
(pyspark.worker, pyarrow, confluent-kafka, the pipeline config). Every spark-submit that Airflow runs is a
new session, so every scheduled batch paid that, more than a warm 1M-record ingest takes
(docs/development/measurements.md).

So the driver starts this process first, while the driver JVM starts (2-4 s). It imports what the
daemon and its workers import (`PRELOADED`) and waits on a Unix socket in a private directory. On 2 cores
those imports slow the JVM's start a little and spare the first batch more (`make bench` prints both,
with and without). When the JVM starts Spark's daemon (`spark.python.daemon.module`, offsetlake/spark/daemon.py),
that new interpreter imports nothing heavy: it hands this process its standard input, output and error
(the pipes the JVM reads the daemon's socket address from and writes worker pids to), its environment,
working directory and arguments; this process forks, and the child becomes pyspark's daemon on those
pipes, with everything imported. The JVM's process then only waits for that daemon to exit, and passes on
SIGTERM (Spark's way of stopping a daemon). Workers are forked from the daemon as before.

A request is refused (and the JVM's process starts pyspark's daemon itself, as without this) when the
fork could differ from a fresh start: another Python executable, another import path (PYTHONPATH,
--py-files) or other interpreter-wide settings (PYTHONHASHSEED: string hashes partition data). Only local
sessions use it: on a cluster the executors start their daemons on their own hosts. The process exits when
the driver does (its standard input is a pipe from the driver: end of file).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

from offsetlake.spark import daemon as spark_daemon
from offsetlake.spark.allocator import keep_freed_memory, touch_heap

SWITCH_ENV = "OFFSETLAKE_SPARK_PREWARM"  # "0": sessions start without it (Spark's daemon starts as it would)
# What Spark's daemon and its workers import (the latter on unpickling a batch's task): imported before any
# fork, each is imported once per session instead of once per worker.
PRELOADED = ("pyspark.daemon", "pyspark.worker", "offsetlake.read.tasks")
# Read by the interpreter as it starts, so a fork keeps the values this process started with.
INTERPRETER_ENV = ("PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONUTF8", "PYTHONMALLOC", "PYTHONDEVMODE", "PYTHONSAFEPATH")


class Prewarmed:
    """The process this driver started, and its socket's path (which the daemon module looks for)."""

    def __init__(self, process: subprocess.Popen, address: str):
        self.process, self.address = process, address

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """End it (by its pid, once); daemons it forked stay with the JVM that asked for them."""
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        _remove(self.address)


_started: Prewarmed | None = None


def start() -> Prewarmed | None:
    """This driver's process (one per driver, shared by its sessions), started now if it is not running;
    None when SWITCH_ENV is "0" or it cannot start (sessions then start Spark's daemon as Spark does)."""
    global _started
    if os.environ.get(SWITCH_ENV, "1") == "0":
        return None
    if _started is None or not _started.alive():
        _started = launch()
    return _started


def launch() -> Prewarmed | None:
    """A new process, with the PYTHONHASHSEED PySpark gives its workers (SparkContext: the driver's, else 0)."""
    address = str(Path(tempfile.mkdtemp(prefix="offsetlake-prewarm-")) / "daemon.sock")  # mode 0700
    env = {**os.environ, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", __name__, address],
            stdin=subprocess.PIPE,  # its lifeline: end of file when this driver exits
            stdout=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # a Ctrl-C at the driver's terminal is the driver's to handle
        )
    except OSError:
        _remove(address)
        return None
    return Prewarmed(process, address)


def use_in(context, prewarmed: Prewarmed) -> None:
    """Point the Python daemons of `context` (a SparkContext) at `prewarmed`. PySpark passes
    `context.environment` to every Python function's daemon, so this must come before the first job
    (a daemon started with another environment keeps it)."""
    context.environment[spark_daemon.PREWARMED_ENV] = prewarmed.address


def warm_up(context, prewarmed: Prewarmed) -> threading.Thread | None:
    """Point `context` at `prewarmed` and run, in a thread, a job of one task per core: Spark's first Python
    job of a session (the JVM's first job, the daemon handed over, a worker forked for each core) then runs
    while the caller builds its SparkSession on `context`, not in the first batch. Each task grows its
    worker's heap to what a range needs (`prepare_worker`). None when `context` was warmed up before (another
    session on it). The job's errors are left to the batch's own job, which meets them again."""
    if getattr(context, _WARMED, False):
        return None
    setattr(context, _WARMED, True)
    use_in(context, prewarmed)

    def run() -> None:
        slots = context.defaultParallelism
        with contextlib.suppress(Exception):
            context.parallelize(range(slots), slots).mapPartitions(prepare_worker).collect()

    thread = threading.Thread(target=run, name="offsetlake-spark-warm-up", daemon=True)
    thread.start()
    return thread


_WARMED = "_offsetlake_warmed_up"  # set on a SparkContext whose warm-up job ran


def prepare_worker(_rows) -> list:
    """The warm-up job's task, in a Python worker: its heap grown and kept (allocator.touch_heap), so that the
    first range it reads does not fault in every page it holds."""
    touch_heap()
    return []


# This process's side ------------------------------------------------------------------------------------


def serve(address: str) -> None:
    """Listen at `address` (a daemon asking meanwhile waits in the backlog), import PRELOADED, then fork a
    daemon for each acceptable request until the driver goes away; then remove the socket's directory."""
    keep_freed_memory()  # before any thread: its workers read Kafka (allocator.py)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # daemons are reaped by the kernel
    for ending in (signal.SIGTERM, signal.SIGHUP):  # end through `finally`, which removes the directory
        signal.signal(ending, _exit_on_signal)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener, selectors.DefaultSelector() as sel:
        listener.bind(address)
        listener.listen(16)
        try:
            _preload()
            sel.register(listener, selectors.EVENT_READ)
            sel.register(sys.stdin.fileno(), selectors.EVENT_READ)
            while True:
                ready = [key.fileobj for key, _ in sel.select()]
                if listener not in ready:
                    return  # the lifeline: the driver exited or closed it
                conn, _ = listener.accept()
                with conn:
                    try:
                        _answer(conn, listener, sel)
                    except Exception:  # noqa: BLE001 - a bad request: the requester starts its own daemon
                        traceback.print_exc()
        finally:
            _remove(address)


def _exit_on_signal(number: int, _frame) -> None:
    raise SystemExit(128 + number)


def _preload() -> None:
    """Import PRELOADED, at the driver's priority: at a lower one (nice +10 was tried) a busy machine
    starves the imports while the session's first job waits for them."""
    spark_daemon.drop_spark_archives()
    for module in PRELOADED:
        importlib.import_module(module)
    gc.freeze()  # what is imported now is shared by every fork: keep the collector off its pages


def _remove(address: str) -> None:
    Path(address).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        Path(address).parent.rmdir()


def _answer(conn: socket.socket, listener: socket.socket, sel: selectors.BaseSelector) -> None:
    payload, fds = _receive(conn)
    try:
        request = json.loads(payload)
        refusal = refusal_of(request) if len(fds) == 3 else "three standard streams expected"
        if refusal:
            conn.sendall(f"refused: {refusal}".encode())
        elif os.fork() == 0:
            os._exit(_as_daemon(request, fds, conn, closing=(sel, listener)))  # the child never returns
    finally:
        for fd in fds:
            os.close(fd)


def refusal_of(request: dict) -> str | None:
    """Why a fork of this process would not be what a fresh `python -m offsetlake.spark.daemon` would
    be for `request`, or None. The first entry of sys.path is the working directory of `-m`, set apart."""
    if request["executable"] != os.path.realpath(sys.executable):
        return f"Python {request['executable']}, not {os.path.realpath(sys.executable)}"
    if _importable_from(request["path"]) != _importable_from(sys.path):
        return "another import path"
    for name in INTERPRETER_ENV:
        if request["env"].get(name) != os.environ.get(name):
            return f"another {name}"
    return None


def _importable_from(path: list[str]) -> list[str]:
    """sys.path as the daemon module sees it once Spark's archives are off it, without its first entry."""
    return [entry for entry in path[1:] if not spark_daemon._is_spark_archive(entry)]


def _as_daemon(request: dict, fds: list[int], conn: socket.socket, closing) -> int:
    """In the forked child: take the requester's streams, environment and directory, answer with this
    process's pid, run pyspark's daemon; its exit code."""
    try:
        for owned in closing:
            owned.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)  # 0 replaces the lifeline from the driver
        for fd in (fd for fd in fds if fd > 2):
            os.close(fd)  # the workers this daemon forks must not hold the JVM's pipes twice
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.path[:] = [request["path"][0], *_importable_from(request["path"])]
        sys.argv[:] = request["argv"]
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", closefd=False, buffering=1)
        sys.stderr = open(2, "w", closefd=False, buffering=1)
        for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)  # pyspark's daemon sets its own
        conn.sendall(str(os.getpid()).encode())
        conn.close()
        spark_daemon.run()
    except SystemExit as stop:  # pyspark's daemon ends with sys.exit
        return stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 - nothing may return into this process's loop: say it, exit
        traceback.print_exc()
        return 1
    return 0


def _receive(conn: socket.socket) -> tuple[bytes, list[int]]:
    message, fds, _, _ = socket.recv_fds(conn, 1, 3)
    return message + spark_daemon.read_to_end(conn), fds


if __name__ == "__main__":
    serve(sys.argv[1])

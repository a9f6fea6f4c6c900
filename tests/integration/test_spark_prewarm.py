"""The prewarmed process (offsetlake/spark/prewarm.py): a local session's Python daemon is forked from it
with the task code imported, on the pipes and with the environment Spark gave the process it started, and
everything ends with the JVM or the driver that owns it.

The source of truth is the kernel (/proc: parents, mapped libraries) and the interpreter's own answers,
not offsetlake's bookkeeping; the requests below are made as Spark's PythonWorkerFactory makes them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from offsetlake.spark import daemon as spark_daemon
from offsetlake.spark import prewarm


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return True  # exited; its parent (not this test) has yet to reap it
        time.sleep(0.05)
    return False


def string_hash_with_seed(seed: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", "print(hash('offsetlake'))"],
        env={**os.environ, "PYTHONHASHSEED": seed},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)


def test_a_local_sessions_workers_are_forked_from_the_prewarmed_process(spark):
    prewarmed = prewarm.start()  # the one the fixture's session started
    assert prewarmed is not None and prewarmed.alive()

    def worker_facts(index, _rows):  # nested: pickled by value
        import os as worker_os
        from pathlib import Path as WorkerPath

        daemon = worker_os.getppid()
        stat = WorkerPath(f"/proc/{daemon}/stat").read_text().rsplit(")", 1)[1].split()
        return [
            {
                "daemon_parent": int(stat[1]),
                "hash": hash("offsetlake"),
                "seed": worker_os.environ.get("PYTHONHASHSEED"),
                "spark_env": "PYTHON_WORKER_FACTORY_SOCK_DIR" in worker_os.environ,
                "cwd": worker_os.getcwd(),
            }
        ]

    seen = spark.sparkContext.parallelize(range(2), 2).mapPartitionsWithIndex(worker_facts).collect()
    for worker in seen:
        assert worker["daemon_parent"] == prewarmed.process.pid, seen
        # string hashes partition data (pyspark's portable_hash): the seed Spark sets, in effect
        assert worker["seed"] == "0" and worker["hash"] == string_hash_with_seed("0"), seen
        assert worker["spark_env"] and worker["cwd"] == os.getcwd(), seen


@pytest.fixture
def sock_dir():
    """Where the daemon makes its socket, as Spark's PYTHON_WORKER_FACTORY_SOCK_DIR: short, since a Unix
    socket's path has at most 107 bytes (pytest's tmp_path under xdist is longer)."""
    path = Path(tempfile.mkdtemp(prefix="offsetlake-sock-"))
    yield path
    shutil.rmtree(path)


@pytest.fixture
def prewarmed():
    """A process of this test's own (not the session's), stopped by its pid; listening when the test begins.
    A daemon waits for the socket only BIND_WAIT_SECONDS (a JVM asks seconds after its driver started the
    process), and on a busy machine this process's start took longer than that, so a request made at once
    met no process and started its daemon itself, silently, whatever the test asked of the handover."""
    started = prewarm.launch()
    assert started is not None
    deadline = time.monotonic() + 60
    while not listening(started.address):
        assert started.alive() and time.monotonic() < deadline, "the prewarmed process did not listen"
        time.sleep(0.05)
    yield started
    started.stop()


def start_daemon(prewarmed, sock_dir: Path, **env) -> subprocess.Popen:
    """Start offsetlake's daemon module as Spark's PythonWorkerFactory does: its environment, pipes on
    the three streams, Unix domain sockets."""
    environment = {
        **os.environ,
        spark_daemon.PREWARMED_ENV: prewarmed.address,
        "PYTHONHASHSEED": "0",
        "PYTHON_UNIX_DOMAIN_ENABLED": "true",
        "PYTHON_WORKER_FACTORY_SOCK_DIR": str(sock_dir),
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "offsetlake.spark.daemon"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment,
    )


def daemon_address(process: subprocess.Popen) -> str:
    """What pyspark's daemon writes first on its standard output: its socket's path, length first."""
    head = process.stdout.read(4)
    assert len(head) == 4, process.stderr.read().decode()[-3000:]
    (length,) = struct.unpack("!i", head)
    return process.stdout.read(length).decode()


def unix_sockets_at(address: str) -> list[list[str]]:
    """The fields of each socket bound at `address` (/proc/net/unix: Num RefCount Protocol Flags Type St Inode)."""
    return [line.split() for line in Path("/proc/net/unix").read_text().splitlines() if line.endswith(address)]


def listeners_at(address: str) -> list[list[str]]:
    """The sockets at `address` that accept connections (flags __SO_ACCEPTCON, 00010000): a connection the
    listener accepted shows the same address, and may be held by another process (a forked daemon)."""
    return [fields for fields in unix_sockets_at(address) if fields[3] == "00010000"]


def listening(address: str) -> bool:
    """A socket at `address` accepts connections."""
    return bool(listeners_at(address))


def listener_pid(address: str) -> int:
    """The process holding the listening socket `address` (from /proc/net/unix and the fds in /proc)."""
    inode = next(fields[6] for fields in listeners_at(address))
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            if os.readlink(fd) == f"socket:[{inode}]":
                return int(fd.parts[2])
        except OSError:
            continue
    raise AssertionError(f"no process listens on {address}")


def test_a_daemon_handed_over_works_on_the_requesters_pipes_and_stops_with_its_sigterm(prewarmed, sock_dir):
    requester = start_daemon(prewarmed, sock_dir)
    address = daemon_address(requester)
    daemon = listener_pid(address)
    assert daemon != requester.pid and parent_of(daemon) == prewarmed.process.pid
    maps = Path(f"/proc/{daemon}/maps").read_text()
    assert "libarrow" in maps and "cimpl" in maps  # pyarrow and confluent-kafka, imported before any fork

    # A worker, asked for as the JVM asks: connect, read its pid; then the JVM's kill: the pid on stdin.
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(address)
        (worker,) = struct.unpack("!i", conn.recv(4, socket.MSG_WAITALL))
        assert parent_of(worker) == daemon
        requester.stdin.write(struct.pack("!i", worker))
        requester.stdin.flush()
        assert gone(worker)

    requester.terminate()  # what Process.destroy() does when Spark stops its daemon
    assert requester.wait(timeout=10) == 0
    assert gone(daemon)


def test_a_daemon_handed_over_ends_when_its_jvm_closes_its_input(prewarmed, sock_dir):
    requester = start_daemon(prewarmed, sock_dir)
    daemon = listener_pid(daemon_address(requester))
    requester.stdin.close()  # the JVM exited
    assert requester.wait(timeout=10) == 0
    assert gone(daemon)


def test_a_request_that_a_fork_would_not_honour_starts_sparks_daemon_afresh(prewarmed, sock_dir):
    requester = start_daemon(prewarmed, sock_dir, PYTHONHASHSEED="7")
    daemon = listener_pid(daemon_address(requester))
    assert daemon == requester.pid  # pyspark's daemon in the process Spark started
    requester.stdin.close()
    requester.wait(timeout=10)  # pyspark's daemon ends with status 1 however it ends
    assert "the prewarmed process refused: another PYTHONHASHSEED" in requester.stderr.read().decode()


def test_without_the_prewarmed_process_the_daemon_starts_as_spark_starts_it(prewarmed, sock_dir):
    prewarmed.stop()
    requester = start_daemon(prewarmed, sock_dir)
    assert listener_pid(daemon_address(requester)) == requester.pid
    requester.stdin.close()
    requester.wait(timeout=10)
    assert requester.stderr.read() == b""


def test_the_prewarmed_process_ends_with_its_driver_and_leaves_nothing_behind():
    driver = subprocess.run(
        [
            sys.executable,
            "-c",
            "from offsetlake.spark import prewarm; p = prewarm.start(); print(p.process.pid, p.address)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    pid, address = driver.stdout.split()
    assert gone(int(pid))
    assert not Path(address).parent.exists()


def test_the_prewarmed_process_stopped_by_sigterm_removes_its_directory(prewarmed):
    deadline = time.monotonic() + 30
    while not Path(prewarmed.address).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Path(prewarmed.address).exists()
    os.kill(prewarmed.process.pid, signal.SIGTERM)  # not prewarmed.stop(): that removes it itself
    prewarmed.process.wait(timeout=30)
    assert not Path(prewarmed.address).parent.exists()


WARMED_SESSION = """
import json, os
from pathlib import Path
from offsetlake.spark import prewarm
from offsetlake.spark.session import build_session

def children(parent):
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            pass  # a process that ended meanwhile
    return sorted(found)

spark = build_session("warm-up", "local[2]")
daemons = children(prewarm.start().process.pid)
workers = [pid for daemon in daemons for pid in children(daemon)]
tracker = spark.sparkContext.statusTracker()
jobs = []
for job in sorted(tracker.getJobIdsForGroup(None)):
    info = tracker.getJobInfo(job)
    jobs.append([info.status, sum(tracker.getStageInfo(stage).numTasks for stage in info.stageIds)])
task_pids = spark.sparkContext.parallelize(range(2), 2).mapPartitions(lambda _rows: [os.getpid()]).collect()
print(json.dumps({"jobs": jobs, "daemons": daemons, "workers": workers, "task_pids": task_pids,
                  "daemons_after": children(prewarm.start().process.pid)}))
spark.stop()
"""


def test_a_local_session_is_ready_with_sparks_python_daemon_and_a_worker_per_core_already_running():
    """The warm-up job (prewarm.warm_up) ran while the SparkSession was built: when build_session returns,
    Spark's status tracker shows one finished job of a task per core, and the kernel shows the daemon forked
    from the prewarmed process with a worker per core; the caller's first job runs in those workers."""
    env = {key: value for key, value in os.environ.items() if key != prewarm.SWITCH_ENV}
    done = subprocess.run([sys.executable, "-c", WARMED_SESSION], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["jobs"] == [["SUCCEEDED", 2]], seen
    assert len(seen["daemons"]) == 1 and len(seen["workers"]) == 2, seen
    assert set(seen["task_pids"]) <= set(seen["workers"]), seen  # no worker forked for the caller's job
    assert seen["daemons_after"] == seen["daemons"], seen

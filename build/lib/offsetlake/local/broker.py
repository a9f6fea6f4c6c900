"""The embedded Kafka broker (noida-db) for tests and `make demo`: start, wait until it answers, stop by PID.

The noida-db console script is a Python wrapper that does not forward signals,
so we start the binary it wraps directly: the PID we record is the broker's
own, and SIGTERM reaches it (it snapshots its data on shutdown).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from offsetlake.errors import KafkaError
from offsetlake.local import processes

HOST = "127.0.0.1"
MARKER = "noida-db"


@dataclass
class Broker:
    pid: int
    port: int
    data_dir: Path
    host: str = HOST

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"


def binary() -> str:
    path = files("noida_db").joinpath("noida-db")
    if not path.is_file():
        raise KafkaError(f"noida-db binary not found at {path}; is the noida-db package installed?")
    os.chmod(str(path), 0o755)
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start(
    data_dir: Path | str,
    port: int | None = None,
    pid_file: Path | str | None = None,
    log_file: Path | str | None = None,
    timeout: float = 30.0,
    host: str = HOST,
    netns: str | None = None,
) -> Broker:
    """Start noida-db on `host` (127.0.0.1; a test host's address with `netns`, the network namespace
    that holds it: `ip netns exec` execs the broker, so the PID is still the broker's own)."""
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    prefix = ["ip", "netns", "exec", netns] if netns else []
    log_path = Path(log_file) if log_file else data_dir / "broker.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [
                *prefix,
                binary(),
                "start",
                "--data-dir",
                str(data_dir),
                "--host",
                host,
                "--only",
                "kafka",
                "--kafka-port",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    broker = Broker(proc.pid, port, data_dir, host)
    if pid_file:
        Path(pid_file).write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise KafkaError(f"noida-db exited with code {proc.returncode} on port {port}; see {log_path}")
        if _answers(host, port):
            return broker
        time.sleep(0.1)
    stop(proc.pid)
    raise KafkaError(f"noida-db did not answer on {host}:{port} within {timeout:.0f}s; see {log_path}")


def _answers(host: str, port: int) -> bool:
    """A Kafka metadata round trip, not just an open socket."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            pass
    except OSError:
        return False
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": f"{host}:{port}"}).list_topics(timeout=2)
        return True
    except Exception:
        return False


def stop(pid: int, timeout: float = 20.0) -> bool:
    """SIGTERM (the broker saves its data), then SIGKILL if it will not go. True if it was running."""
    return processes.stop(pid, timeout)


def stop_from_pid_file(pid_file: Path | str) -> bool:
    return processes.stop_from_pid_file(Path(pid_file), MARKER)


def running_from_pid_file(pid_file: Path | str) -> int | None:
    pid = processes.read_pid(Path(pid_file))
    return pid if processes.runs(pid, MARKER) else None

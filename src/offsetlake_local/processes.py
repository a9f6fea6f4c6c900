"""Stopping what we started, by PID: never a recycled PID, never anything else.

A pid file can outlive its process, and the PID can be reused by something
unrelated; so before signalling we check the process' command line still
names what we started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def runs(pid: int, marker: str) -> bool:
    """Is `pid` alive and is `marker` in its command line?"""
    try:
        return pid > 0 and marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def read_pid(pid_file: Path) -> int:
    try:
        return int(pid_file.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def stop(pid: int, timeout: float = 20.0, group: bool = False) -> bool:
    """SIGTERM (the process, or its whole process group), then SIGKILL if it will not go."""
    send = os.killpg if group else os.kill
    try:
        send(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid, group):
            return True
        time.sleep(0.1)
    try:
        send(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def _alive(pid: int, group: bool) -> bool:
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid and not group:
            return False  # our child, now reaped
    except ChildProcessError:
        pass  # not our child: probe instead
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_from_pid_file(pid_file: Path, marker: str, group: bool = False, timeout: float = 20.0) -> bool:
    """Stop the process a pid file names, if it is still ours. Removes the pid file. True if it ran."""
    pid = read_pid(pid_file)
    stopped = runs(pid, marker) and stop(pid, timeout, group)
    pid_file.unlink(missing_ok=True)
    return bool(stopped)


def kill(pid: int, timeout: float = 10.0) -> bool:
    """SIGKILL at once (a machine that dies: no shutdown hook runs) and wait until it is gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while _alive(pid, False) and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


def stop_all(pids: list[int], timeout: float = 20.0) -> None:
    """SIGTERM every process at once, then SIGKILL what is left after `timeout`: nodes of one cluster, each
    of which may wait for the others while it shuts down."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while any(_alive(pid, False) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid, False):
            kill(pid)


def start_background(command: list[str], log: Path, pid_file: Path) -> int:
    """Run `command` in a session of its own, its output appended to `log`, its PID written to `pid_file`
    (for `stop_from_pid_file`). Returns the PID."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    pid_file.write_text(f"{proc.pid}\n")
    return proc.pid

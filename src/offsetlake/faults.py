"""Named fault points, so tests can kill or freeze a real job at the worst moments.

Exactly-once is a claim about crashes; the only honest proof is to crash the
real job (driver, JVM and Python workers) at each step of the batch protocol
and check the table afterwards. With no OFFSETLAKE_FAULT set they do nothing.

    OFFSETLAKE_FAULT=<point>:<action>[,<point>:<action>]
      point:  after_plan | after_read | after_task_write | after_files_written | before_commit | after_commit
              (after_read and after_task_write are hit inside each Spark task, the others on the driver;
              after_read once a range's first chunk is read, before any of its files is begun)
      action: exit  -> SIGKILL the job's driver process (no clean-up, no finally blocks), having touched
                       $OFFSETLAKE_FAULT_DIR/<point>.killed when that directory is given
              pause -> touch $OFFSETLAKE_FAULT_DIR/<point>.reached, then wait until
                       $OFFSETLAKE_FAULT_DIR/<point>.release exists (a zombie attempt)
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

POINTS = ("after_plan", "after_read", "after_task_write", "after_files_written", "before_commit", "after_commit")
ENV = "OFFSETLAKE_FAULT"
DIR_ENV = "OFFSETLAKE_FAULT_DIR"


def parse(spec: str | None) -> dict[str, str]:
    if not spec:
        return {}
    faults = {}
    for item in spec.split(","):
        point, _, action = item.strip().partition(":")
        if point not in POINTS or action not in ("exit", "pause"):
            raise ValueError(f"{ENV}: bad fault {item!r}; use <point>:exit|pause with point one of {', '.join(POINTS)}")
        faults[point] = action
    return faults


def settings_from_env() -> dict:
    """Captured on the driver and shipped to executors with the task context."""
    return {
        "faults": parse(os.environ.get(ENV)),
        "dir": os.environ.get(DIR_ENV, "."),
        "dir_given": bool(os.environ.get(DIR_ENV)),
        "driver_pid": os.getpid(),
    }


def hit(point: str, settings: dict | None = None) -> None:
    settings = settings if settings is not None else settings_from_env()
    action = settings["faults"].get(point)
    if action is None:
        return
    if action == "exit":
        if settings.get("dir_given"):
            # Said before it happens, so a test tells this kill from any other (the kernel's OOM killer's).
            directory = Path(settings["dir"])
            directory.mkdir(parents=True, exist_ok=True)
            (directory / f"{point}.killed").touch()
        os.kill(settings["driver_pid"], signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)  # in an executor: do not outlive the driver
    directory = Path(settings["dir"])
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{point}.reached").touch()
    release = directory / f"{point}.release"
    while not release.exists():
        time.sleep(0.1)

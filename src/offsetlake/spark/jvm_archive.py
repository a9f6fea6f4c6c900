"""A class-data-sharing archive (JDK AppCDS) of the Spark driver's classes: sessions start sooner.

A Spark driver JVM reads, parses and verifies thousands of classes from Spark's jars while it starts and
again during its first job. A dynamic CDS archive holds them already parsed, mapped from one file. On the
2-core machine this was built on, a local session started in 2.9 s instead of 4.7-5.4 s and its first job
took 0.54-0.64 s instead of 0.72-0.94 s; every spark-submit that Airflow runs starts such a JVM.

Rules kept here, each because the JVM demands it:
- A JVM that maps a truncated archive dies with SIGBUS (seen). So an archive is dumped under a temporary
  name and reaches its own name by one rename, and only after the JVM that dumped it exited with 0; it is
  never rewritten in place (a rename leaves a JVM that has the old file mapped untouched).
- An archive holds only for the JVM build and the class path it was dumped with, down to each jar's size
  and time. Its name carries a key of both; a JVM that still cannot use it starts without it, silently
  (`-Xlog:cds*=off`: its warning would otherwise go to stdout), and a missing archive is ignored by the JVM
  too.
- Only driver JVMs started on this host get it (PySpark's, or spark-submit's in client mode); executors on
  a cluster start their own JVMs, with their own class paths.

`python -m offsetlake.spark.jvm_archive` builds it once per machine (about 20 s; `make` does it, the Dockerfile
too); `spark_conf` adds it to a session's driver options whenever it exists.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

DUMP_TIMEOUT_SECONDS = 300
QUIET = "-Xlog:cds*=off"  # a JVM that cannot use the archive says so on stdout; it is harmless


def java_executable() -> Path | None:
    """The java that Spark's launcher runs: $JAVA_HOME/bin/java, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def spark_jars() -> Path | None:
    """The jars directory of the Spark that PySpark launches (SPARK_HOME, else the pyspark package)."""
    home = os.environ.get("SPARK_HOME")
    if not home:
        import importlib.util

        spec = importlib.util.find_spec("pyspark")
        if spec is None or not spec.submodule_search_locations:
            return None
        home = spec.submodule_search_locations[0]
    jars = Path(home) / "jars"
    return jars.resolve() if jars.is_dir() else None


def archive_dir() -> Path:
    explicit = os.environ.get("OFFSETLAKE_JVM_ARCHIVE_DIR")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "offsetlake"


def archive_path() -> Path | None:
    """Where the archive for this JVM build and these Spark jars lives (None: no java or no Spark here)."""
    java, jars = java_executable(), spark_jars()
    if java is None or jars is None:
        return None
    # The java binary's size and time change with every JDK update. A JVM refuses an archive whose jars were
    # rewritten since it was dumped (a reinstall of the same pyspark), so each jar's size and time count too.
    stamped_jars = sorted(f"{p.name} {_stamp(p)}" for p in jars.glob("*.jar"))
    identity = "\n".join([str(java), _stamp(java), str(jars), *stamped_jars])
    return archive_dir() / f"spark-driver-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.jsa"


def _stamp(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size} {stat.st_mtime_ns}"


def driver_java_options() -> str:
    """The driver options that use the archive, or "" when there is none for this JVM and Spark."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path is not None and path.is_file() else ""


def build(force: bool = False) -> Path | None:
    """Dump the archive (in a child process: its own JVM) unless one exists. Returns its path, or None
    when there is no java or Spark to make one for. Raises RuntimeError with the child's last line."""
    path = archive_path()
    if path is None or (path.is_file() and not force):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "offsetlake.spark.archive_dump", str(partial)],
            capture_output=True,
            text=True,
            timeout=DUMP_TIMEOUT_SECONDS,
        )
        if done.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
            last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            raise RuntimeError(f"could not dump the JVM class archive to {path}: {last}")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def main(argv: list[str]) -> int:
    force = argv == ["--force"]
    if argv and not force:
        print("usage: python -m offsetlake.spark.jvm_archive [--force]", file=sys.stderr)
        return 2
    try:
        path = build(force)
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as err:
        print(f"offsetlake: error: {err}", file=sys.stderr)
        return 1
    print(f"JVM class archive: {path}" if path else "JVM class archive: no java or Spark here, none made")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

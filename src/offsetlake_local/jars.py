"""JVM artifacts of the embedded stack, resolved from Maven Central into a cache outside the repo.

Each stack is one Maven POM shipped in this package (`poms/<name>.xml`), whose dependencies are pinned there
and nowhere else. `mvn dependency:copy-dependencies` copies the resolved jars into
`~/.cache/offsetlake/jvm/<name>-<hash of the POM>/`, and a `.complete` file written last marks the directory
whole; a new POM (another version) gets a new directory, and an interrupted copy is redone. `make` resolves
them once per machine (`python -m offsetlake_local.jars`); later calls return the directory at once.
No jar is ever committed.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from offsetlake.errors import OffsetlakeError

STACKS = ("kafka-broker", "delta-spark", "kafka-connect", "hive-metastore", "hive-client")
RESOLVE_TIMEOUT_SECONDS = 900


def pom(stack: str) -> Path:
    path = Path(__file__).parent / "poms" / f"{stack}.xml"
    if not path.is_file():
        raise OffsetlakeError(f"no POM for the JVM stack {stack!r} at {path}")
    return path


def cache_root() -> Path:
    explicit = os.environ.get("OFFSETLAKE_JVM_CACHE")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "offsetlake" / "jvm"


def jar_dir(stack: str) -> Path:
    """Where the stack's jars are, resolving them first if this POM's are not there yet."""
    source = pom(stack)
    key = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    target = cache_root() / f"{stack}-{key}"
    if not (target / ".complete").exists():
        _resolve(source, target)
    return target


def classpath(stack: str) -> str:
    return str(jar_dir(stack) / "*")


def spark_jars(stack: str) -> list[str]:
    """The stack's jars for `spark.jars`, less those Spark ships itself (any version): a library Spark has is
    Spark's, so a stack's older Jackson, Hadoop client, Parquet, Netty or Scala never shadows Spark's own."""
    import pyspark

    def artifact(jar: Path) -> str:
        return re.sub(r"-\d[\w.\-]*\.jar$", "", jar.name)

    spark_has = {artifact(jar) for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return sorted(str(jar) for jar in jar_dir(stack).glob("*.jar") if artifact(jar) not in spark_has)


def delta_spark_stack() -> str:
    """The delta-spark stack for the installed pyspark: `delta-spark` (poms/delta-spark.xml) pairs with the pinned
    pyspark's line; another line of pyproject's range has a POM of its own (`delta-spark-4.0.xml`)."""
    import pyspark

    line = ".".join(pyspark.__version__.split(".")[:2])
    if line == _spark_line("delta-spark"):
        return "delta-spark"
    if (Path(__file__).parent / "poms" / f"delta-spark-{line}.xml").is_file():
        return f"delta-spark-{line}"
    raise OffsetlakeError(f"no delta-spark POM pairs with pyspark {pyspark.__version__} (src/offsetlake_local/poms)")


def delta_spark_jars_arg() -> str:
    """delta-spark's jars as spark-submit's `--jars` takes them (for `PYSPARK_SUBMIT_ARGS`)."""
    return f"--jars {','.join(spark_jars(delta_spark_stack()))}"


def _spark_line(stack: str) -> str:
    """The POM's `spark.line` property, e.g. "4.2"."""
    found = re.search(r"<spark\.line>([^<]+)</spark\.line>", pom(stack).read_text())
    return found.group(1) if found else ""


def _resolve(source: Path, target: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise OffsetlakeError(
            "mvn not found: the embedded Kafka broker's jars come from Maven Central (apt-get install maven)"
        )
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    command = [
        mvn,
        "--batch-mode",
        "--quiet",
        "--file",
        str(source),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={partial}",
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired as err:
        raise OffsetlakeError(f"resolving {source.name} from Maven Central took over {err.timeout:.0f}s") from err
    if done.returncode != 0:
        raise OffsetlakeError(f"mvn could not resolve {source.name}: {_first_error(done.stdout + done.stderr)}")
    (partial / ".complete").write_text(source.read_text())
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def _first_error(output: str) -> str:
    """Maven's first `[ERROR]` line (the one naming the artifact), without its colour codes."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in output.splitlines()]
    errors = [line.removeprefix("[ERROR]").strip() for line in lines if line.startswith("[ERROR]")]
    return next((e for e in errors if e), next((line for line in reversed(lines) if line), "(no output)"))


def main() -> int:
    for stack in STACKS:
        try:
            print(f"{stack}: {jar_dir(stack)}")
        except OffsetlakeError as err:
            print(f"offsetlake: error: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

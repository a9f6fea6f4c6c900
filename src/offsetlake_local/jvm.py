"""What the local stack's JVM processes (the Kafka broker, the Kafka Connect worker) share: the java they run
(`JAVA_HOME`'s, else the one on PATH), their command line, and a log4j2 file that keeps warnings and the
few info lines that say a process is up."""

from __future__ import annotations

import os
from pathlib import Path

from offsetlake_local import jars

LOG4J = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
"""


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


# Options every JVM of the local stack adds last (so they win), as Kafka's scripts take KAFKA_OPTS. The tests
# set `-XX:TieredStopAtLevel=1` (tests/conftest.py); the demo and the benchmarks run the JVM's defaults.
OPTIONS_ENV = "OFFSETLAKE_STACK_JAVA_OPTIONS"


def command(stack: str, heap: str, log4j_file: Path, *options: str) -> list[str]:
    """java with a capped heap and G1, the stack's jars (offsetlake_local.jars) on the class path, and the
    options of OFFSETLAKE_STACK_JAVA_OPTIONS."""
    return [
        java(),
        f"-Xmx{heap}",
        *options,
        "-XX:+UseG1GC",
        "-XX:+ExitOnOutOfMemoryError",
        *os.environ.get(OPTIONS_ENV, "").split(),
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j_file}",
        "-cp",
        jars.classpath(stack),
    ]


def log4j2(log: Path, info: tuple[str, ...] = ()) -> str:
    """A log4j2 configuration: warnings and above into `log`, and the `info` loggers' info lines."""
    lines = [LOG4J.format(log=log)]
    for i, name in enumerate(info):
        lines.append(f"logger.info{i}.name = {name}\nlogger.info{i}.level = info\n")
    return "".join(lines)

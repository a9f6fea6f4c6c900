"""C libraries of offsetlake's own, built once per machine with its C compiler.

The native Kafka reader (`read/native_reader.c`) and the formats' decoders (`formats/json_columns.c`,
`formats/flat_avro.c`) are C sources shipped in the package. Each is built on first use, or at `make install`, into
`~/.cache/offsetlake/native/` under a name made of its source and what it links to, so a changed source or
library builds anew; a rename makes a library appear whole while other processes may build it too. Where
there is no compiler the callers read without it (their modules say how).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


class NativeUnavailable(Exception):
    """A C library cannot be built or loaded here (the message says why)."""


def library_path(sources: list[Path], name: str, identity: list[str]) -> Path:
    """Where `sources` (C files and the headers they include) built as `name` live; `identity`: what else
    decides the build (linked libraries)."""
    digest = hashlib.sha256("\n".join([*(s.read_text() for s in sources), *identity]).encode()).hexdigest()[:16]
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "offsetlake" / "native" / f"{name}-{digest}.so"


def build(sources: list[Path], name: str, identity: list[str], link: list[str]) -> Path:
    """Build `sources`' C files into one shared library unless it is built; its path. `link`: the linker's
    arguments. Raises NativeUnavailable with the reason."""
    target = library_path(sources, name, identity)
    if target.exists():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise NativeUnavailable("no C compiler (cc) on this machine")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=target.stem, suffix=".partial")
    os.close(fd)
    compiled = [str(s) for s in sources if s.suffix == ".c"]
    command = [compiler, "-O2", "-shared", "-fPIC", "-std=gnu11", "-o", partial, *compiled, *link]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise NativeUnavailable(f"{Path(compiler).name} failed: {done.stderr.strip()[-500:]}")
        os.replace(partial, target)  # whole or not at all: another process may be building it too
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target

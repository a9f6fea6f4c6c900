"""The checks that keep the code as it is: ruff (lint and format) over the project's Python, mypy over
src/ (strict on the protocol core), configured in pyproject.toml. `make lint` fixes what ruff can."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CODE = ["src", "tests", "docs", "dags", "plugins", "jobs"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / args[0]), *args[1:]], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    proc = run("ruff", "check", *CODE)
    assert proc.returncode == 0, f"ruff check (make lint fixes most):\n{proc.stdout[-4000:]}"


def test_the_code_is_formatted_as_ruff_formats_it():
    proc = run("ruff", "format", "--check", *CODE)
    assert proc.returncode == 0, f"ruff format --check (make lint formats):\n{proc.stdout[-4000:]}"


def test_mypy_finds_nothing():
    proc = run("mypy")
    assert proc.returncode == 0, f"mypy (configured in pyproject.toml):\n{proc.stdout[-4000:]}"

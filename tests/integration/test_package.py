"""The package as a user gets it: the wheel built from this checkout, installed into an empty virtual
environment with the dependencies pyproject.toml declares and nothing else, ingests from the broker on
Spark executors whose Python is that environment's, with nothing of this checkout on any path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO, assert_exactly_once, load, produce

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel, installed into a new venv (its `bin/`)."""
    work = tmp_path_factory.mktemp("package")
    source = work / "source"  # a copy of what the wheel is built from: setuptools writes build/ beside it
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(work), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    [wheel] = work.glob("offsetlake-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", str(wheel)], capture_output=True, text=True, timeout=900
    )
    assert install.returncode == 0, install.stderr[-3000:]
    return venv / "bin"


def clean_env(home: Path) -> dict[str, str]:
    """No PYTHONPATH, no venv of this checkout on PATH, OFFSETLAKE_HOME elsewhere."""
    keep = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "OFFSETLAKE_HOME")}
    path = [p for p in keep.get("PATH", "").split(os.pathsep) if not p.startswith(str(REPO))]
    return {**keep, "PATH": os.pathsep.join(path), "OFFSETLAKE_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1"}


def test_the_wheel_installs_with_its_declared_dependencies_and_ingests_on_its_own(
    installed, pipeline, pipelines_dir, tmp_path
):
    python = installed / "python"
    home = tmp_path / "elsewhere"
    home.mkdir()
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import offsetlake, importlib.util as u; print(offsetlake.__file__, u.find_spec('airflow'))",
        ],
        cwd=home,
        env=clean_env(home),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert where.returncode == 0, where.stderr
    module, airflow = where.stdout.split()
    assert module.startswith(str(installed.parent)) and airflow == "None"  # the core needs no Airflow

    cfg, topic = pipeline(partitions=2)
    produce(cfg.kafka, topic, 800, seed=27, bad_share=0.02)
    ingest = subprocess.run(
        [str(installed / "offsetlake"), "ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir)],
        cwd=home,
        env={**clean_env(home), "PYSPARK_PYTHON": str(python)},
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert ingest.returncode == 0, ingest.stderr[-3000:]
    assert "committed table version" in ingest.stdout
    assert_exactly_once(load(pipelines_dir, cfg.name))

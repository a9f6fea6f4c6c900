"""Fixtures of the integration tests."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from offsetlake import cli, runs


@pytest.fixture
def offsetlake(spark, monkeypatch, capsys):
    """`offsetlake <args>` in this process: (exit code, stdout, stderr)."""

    @contextmanager
    def the_tests_session(cfg, job, master=None):
        yield _Session(spark)

    monkeypatch.setattr(runs, "spark_session", the_tests_session)

    def run(*args: str) -> tuple[int, str, str]:
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


class _Session:
    """What runs.spark_session yields (a LazySession): the session, already up."""

    def __init__(self, spark):
        self.spark, self.ready_at = spark, None

    def __getattr__(self, name):
        return getattr(self.spark, name)

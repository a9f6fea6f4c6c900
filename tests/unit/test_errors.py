"""An error raised in a Spark task comes back to the driver as Spark's text: its kind travels as a code
(errors.to_wire), which the driver maps back to the class (errors.from_wire), subclasses included."""

from __future__ import annotations

import pytest

import offsetlake_local.connect  # noqa: F401 -- every module that defines an error kind, whatever ran first
from offsetlake import errors
from offsetlake.errors import OffsetlakeError, TableError, TableMissing, from_wire, to_wire
from offsetlake.formats import registry_client  # noqa: F401


def every_error_class() -> list[type[OffsetlakeError]]:
    found, pending = [], [OffsetlakeError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def with_a_code_of_their_own() -> list[type[OffsetlakeError]]:
    return [cls for cls in every_error_class() if "code" in vars(cls)]


def test_no_two_error_kinds_share_a_code():
    codes = [cls.code for cls in with_a_code_of_their_own()]
    assert len(codes) == len(set(codes)) and all(codes)


@pytest.mark.parametrize("cls", [c for c in with_a_code_of_their_own() if c is not errors.CommitConflictError])
def test_a_task_error_comes_back_of_its_own_kind_with_its_message(cls):
    spark_text = (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "tasks.py", line 212, in run\n'
        f"RuntimeError: {to_wire(cls('no Delta table at s3://lake/t'))}\n"
        "\tat org.apache.spark.api.python.BasePythonRunner..."
    )
    back = from_wire(spark_text)
    assert type(back) is cls and str(back) == "no Delta table at s3://lake/t"


def test_a_subclass_stays_a_subclass_and_other_text_is_not_ours():
    assert isinstance(from_wire(to_wire(TableMissing("gone"))), TableError)

    class Unnamed(TableError):
        """A subclass without a code of its own travels as its parent."""

    assert type(from_wire(to_wire(Unnamed("gone")))) is TableError
    assert from_wire("java.lang.OutOfMemoryError: Java heap space") is None
    assert to_wire(TableError("line one\nline two")) == "[offsetlake-error:table] line one; line two"

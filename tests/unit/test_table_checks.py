"""The checks a pipeline makes of the table it writes (table.check_schema, table.check_row_rules), on real
tables on disk."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from offsetlake.errors import TableError
from offsetlake.table import check_row_rules, check_schema

PIPELINE = pa.schema([pa.field("v", pa.string()), pa.field("kafka_offset", pa.int64(), nullable=False)])


def table_with(tmp_path, *extra: pa.Field) -> tuple[str, DeltaTable]:
    uri = str(tmp_path / "t")
    return uri, DeltaTable.create(uri, pa.schema([*PIPELINE, *extra]))


def test_a_nullable_column_a_user_added_is_allowed(tmp_path):
    uri, table = table_with(tmp_path, pa.field("reviewer", pa.string()))
    check_schema(uri, table, PIPELINE, [])


def test_a_not_null_column_the_pipeline_does_not_write_is_refused_in_one_line_naming_it(tmp_path):
    uri, table = table_with(tmp_path, pa.field("region", pa.string(), nullable=False))
    with pytest.raises(TableError, match=r"column 'region' NOT NULL, which the pipeline does not write: make it") as e:
        check_schema(uri, table, PIPELINE, [])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("columns", "says"),
    [
        ([pa.field("kafka_offset", pa.int64(), nullable=False)], "has no column 'v' that the pipeline writes"),
        ([pa.field("v", pa.int32()), pa.field("kafka_offset", pa.int64())], "column 'v' is int32, the pipeline"),
    ],
)
def test_a_missing_column_or_another_type_is_refused_in_one_line(tmp_path, columns, says):
    uri = str(tmp_path / "t")
    table = DeltaTable.create(uri, pa.schema(columns))
    with pytest.raises(TableError, match=says):
        check_schema(uri, table, PIPELINE, [])


def test_a_check_constraint_is_refused_in_one_line_naming_it_and_its_rule(tmp_path):
    uri, table = table_with(tmp_path)
    table.alter.add_constraint({"positive": "kafka_offset >= 0"})
    with pytest.raises(TableError, match=r"batch 7: table .* has the CHECK constraint positive \(kafka_offset >= 0\)"):
        check_row_rules(uri, DeltaTable(uri), "batch 7")


def test_a_generated_column_is_refused_in_one_line_naming_it(tmp_path):
    generated = pa.field("day", pa.string(), metadata={"delta.generationExpression": "substring(v, 1, 10)"})
    uri, table = table_with(tmp_path, generated)
    with pytest.raises(TableError, match=r"column 'day' is generated \(substring\(v, 1, 10\)\)"):
        check_row_rules(uri, table)


def test_a_table_without_rules_passes(tmp_path):
    uri, table = table_with(tmp_path, pa.field("reviewer", pa.string()))
    check_row_rules(uri, table)

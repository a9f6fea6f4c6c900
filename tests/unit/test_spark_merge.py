"""The upsert clauses of `protocol.upsert.Merge`, written in DataFusion's SQL, as the delta-spark engine gives
them to Spark (engine/spark_merge.py): identifiers requoted, string literals untouched."""

from __future__ import annotations

from offsetlake.engine.spark_merge import spark_sql


def test_double_quoted_identifiers_become_backticked_and_their_escapes_are_undone():
    assert spark_sql('t."user id" = s."user id"') == "t.`user id` = s.`user id`"
    assert spark_sql('t."a""b" >= 1') == 't.`a"b` >= 1'
    assert spark_sql('t."a`b" = 2') == "t.`a``b` = 2"


def test_string_literals_keep_their_quotes_and_whatever_they_hold():
    assert spark_sql("""t."k" = 'say "hi"' AND t."j" = 'it''s'""") == """t.`k` = 'say "hi"' AND t.`j` = 'it''s'"""


def test_datafusion_array_literals_become_sparks():
    assert spark_sql("s.\"tags\" = make_array('x')") == "s.`tags` = array('x')"
    assert spark_sql("make_array(arrow_cast(7, 'Int32'), arrow_cast(-1, 'Int64'))") == (
        "array(CAST(7 AS INT), CAST(-1 AS BIGINT))"
    )

"""An upsert table's change feed from a version on: each batch's inserts, updates (pre- and post-images)
and deletes, as Delta's change data feed records them."""

import os

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable

table = DeltaTable(os.environ.get("OFFSETLAKE_TABLE", "lake/customers"))
changes = pl.from_arrow(pa.table(table.load_cdf(starting_version=1)))
print(changes.group_by("_change_type").len().sort("_change_type"))

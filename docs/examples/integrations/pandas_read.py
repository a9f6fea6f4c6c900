"""The orders table from pandas, through delta-rs, as of a version of your choice (time travel)."""

import os

from deltalake import DeltaTable

table = DeltaTable(os.path.join(os.environ.get("OFFSETLAKE_LAKE", "lake"), "orders"), version=1)
orders = table.to_pandas(columns=["order_id", "customer", "amount"])
print(orders.groupby("customer")["amount"].sum())

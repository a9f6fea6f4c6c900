"""maintenance.referenced_files, the set clean-up keeps, on a real table whose log is cleaned up under it."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from offsetlake.operations import maintenance
from offsetlake.storage.location import Location


def test_a_log_entry_cleaned_up_between_listing_and_reading_makes_the_log_read_again(tmp_path, monkeypatch):
    """Found by a 200-fault chaos run (seed 26112601, append, S3): clean-up failed on a log entry another
    clean-up had just removed. Skipping it would be wrong: its live files may be named only in a checkpoint
    the first listing did not see, and clean-up would delete them. Every live file is referenced."""
    uri = str(tmp_path / "t")
    for n in range(5):
        write_deltalake(uri, pa.table({"n": [n]}), mode="append")
    DeltaTable(uri).alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    real, raced = maintenance._files_named_in, []

    def cleaned_up_meanwhile(fs, info):
        if info.base_name.endswith(".json") and not raced:
            table = DeltaTable(uri)
            table.create_checkpoint()
            table.cleanup_metadata()  # another job's checkpoint and log clean-up, between listing and reading
            raced.append(info.base_name)
        return real(fs, info)

    monkeypatch.setattr(maintenance, "_files_named_in", cleaned_up_meanwhile)

    referenced = maintenance.referenced_files(Location.of(uri))

    live = set(pa.table(DeltaTable(uri).get_add_actions(flatten=True)).column("path").to_pylist())
    assert raced and not (tmp_path / "t" / "_delta_log" / raced[0]).exists()
    assert len(live) == 5 and live <= referenced

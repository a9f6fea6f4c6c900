"""Where tables live and the files in them: `location` (a table's Location: its URI and storage options as
one value, the store's file system, the retry policy and which errors are transient), `parquet` (data
files written in executors and read on the driver, with their Delta statistics) and `delta_log` (one commit
of a table's log read as its actions). Imports: errors only; no module-level state (what a table needs
travels in its Location).
"""

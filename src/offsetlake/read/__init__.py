"""The read path inside Spark tasks: `reader` reads one [start, end) range from Kafka, `tasks` runs a
Spark task's ranges (read, convert, write Parquet). Runs in executors: no deltalake import here.
Imports: config, errors, kafka, storage, faults, protocol.ranges, formats,
c_libraries.
"""

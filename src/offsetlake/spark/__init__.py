"""Spark set-up: `session` builds the session and its settings, `jvm_archive` the driver JVM's class
archive (`archive_dump` is the process that dumps it), `daemon` Spark's Python worker daemon without
Spark's zips on sys.path, `allocator` the C allocator's settings of a process that reads Kafka (set where a
worker daemon starts). Imports: nothing else of offsetlake (a session is asked for by name).
"""

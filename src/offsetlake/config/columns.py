"""The table's column vocabulary: the names offsetlake gives the columns it adds, and the declared types a
pipeline file may name. One definition, read by the configuration, the formats and the commit protocol."""

import re

FIELD_TYPES = ("string", "long", "int", "double", "float", "boolean", "timestamp", "date", "binary")
LINEAGE_COLUMNS = ("kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp")
RAW_COLUMNS = ("key", "value")
KEY_COLUMN = "kafka_key"  # format.key: the decoded Kafka key (formats other than raw)
HEADERS_COLUMN = "kafka_headers"  # format.include_headers: map<string, binary>, every header in order
# Formats in the Confluent wire format (magic byte 0, 4-byte schema id, payload): the table's payload
# columns come from the registry and grow when a record arrives with a newer schema (docs/usage/registry-formats.md).
REGISTRY_FORMATS = ("avro", "protobuf", "json_schema")
# Upsert mode: true on a row that deletes its key (a tombstone). Only in the batch's staging files, never
# in the table: the MERGE reads it.
DELETED_COLUMN = "_offsetlake_deleted"
# Debezium upserts: the old key a primary-key change's create event names (its `__debezium.oldkey` header, as
# the header's bytes; null on every other event). Only in the staging files, like DELETED_COLUMN: the driver
# takes the values the create lacks from the old key's row (protocol/upsert.py, carry_across_key_changes).
OLD_KEY_COLUMN = "_offsetlake_old_key"
# ... and the new key its delete of the old key names (its `__debezium.newkey` header): the delete waits for the
# create when a batch ends between them (protocol/key_changes.py, with_creates_deleting_old_keys).
NEW_KEY_COLUMN = "_offsetlake_new_key"
STAGING_COLUMNS = (DELETED_COLUMN, OLD_KEY_COLUMN, NEW_KEY_COLUMN)
# format.envelope debezium: the event's `op` (c, r, u, d) and its position in the source's log.
DEBEZIUM_OP_COLUMN = "_debezium_op"
DEBEZIUM_POSITION_COLUMN = "_debezium_position"
DEBEZIUM_COLUMNS = (DEBEZIUM_OP_COLUMN, DEBEZIUM_POSITION_COLUMN)
UNKNOWN_FIELDS_COLUMN = "_unknown_fields"  # unknown_fields: keep -> JSON text of the undeclared fields

# A declared `decimal(p,s)`: Delta's (and Spark's) precision 1 to 38, scale 0 to p.
DECIMAL_TYPE = re.compile(r"^decimal\((\d{1,2}),(\d{1,2})\)$")


def decimal_type(type_: str) -> tuple[int, int] | None:
    """(precision, scale) of a declared `decimal(p,s)`; None for any other type."""
    match = DECIMAL_TYPE.match(type_)
    return (int(match[1]), int(match[2])) if match else None

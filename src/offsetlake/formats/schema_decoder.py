"""What every registry format's decoder is: one schema's payloads decoded into Python values of one Arrow
type (`formats.registry` builds them; `protobuf` and `json_schema` hold two kinds)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

TIMESTAMP = pa.timestamp("us", tz="UTC")


class SchemaDecoder:
    """Decodes one schema's payloads into Python values of `arrow_type`."""

    arrow_type: pa.DataType
    kind_name = "record"  # in error messages: "not a valid Avro record"
    label = "schema"  # which schema, in quarantine reasons (set by Decoders)
    # The schema's batch decoder (FlatAvro, FastProtobuf, FastConnect: `decode(payloads)` -> an array or None,
    # and its MIN_RECORDS), or None: every payload goes through `decode`.
    batches: Any = None

    def decode(self, payload: bytes) -> Any:
        raise NotImplementedError

    def decode_many(self, payloads: list[bytes] | pa.BinaryArray) -> pa.Array | None:
        """All payloads at once as an array of `arrow_type`, or None: decode them one by one (no batch
        decoder, too few payloads to gain, or one it refuses)."""
        if self.batches is None or len(payloads) < self.batches.MIN_RECORDS:
            return None
        return self.batches.decode(payloads)

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

    def decode(self, payload: bytes) -> Any:
        raise NotImplementedError

"""Values in a schema's wire format (a registry's, a schema file's, Kafka Connect's JSON) decoded into one
Arrow array, schema by schema: each schema's records together, cast to the type every schema met merges to,
with a reason for each record that could not be decoded or held.
Runs in executors: no deltalake import here.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from offsetlake.config import PipelineConfig
from offsetlake.formats.arrays import one_array
from offsetlake.formats.evolution import Incompatible, merge_type
from offsetlake.formats.halving import spans_together


def registry_decoders(cfg: PipelineConfig, key: bool = False):
    """The value's (or the key's) decoders, one set per pipeline per process: schemas are fetched once."""
    from offsetlake.formats.registry import Decoders

    fmt = cfg.format
    assert fmt.key is not None or not key, "a key section for the key's decoders"
    kind = fmt.key.type if key and fmt.key is not None else fmt.type
    if kind == "connect_json":
        from offsetlake.formats.connect_json import ConnectDecoders

        return ConnectDecoders.shared(key)
    return Decoders.shared(kind, fmt.registry, None if key else fmt.schema_file, key)


def decode_values(decoders, raw: pa.ChunkedArray, table_type: pa.DataType | None, what: str, nulls_allowed: bool):
    """Decode wire-format values. Returns (one Arrow value per raw value, null where it failed or was null;
    the array's type: `table_type` merged with every writer schema met; {position: error}). Records of a
    schema the table cannot hold are errors, with the reason. Each schema's records are decoded together
    (`decode_many`, when the decoder has a batch decoder), then cast to the merged type."""
    from offsetlake.formats.registry import UnusableSchema

    values = one_array(raw)
    errors: dict[int, str] = {}
    groups: dict[int, tuple] = {}  # id(decoder) -> (decoder, positions, payloads)
    bulk, others = decoders.bulk_groups(values)
    for decoder, positions, payloads in bulk:
        if isinstance(decoder, UnusableSchema):
            errors.update({int(i): f"{what}: {decoder}" for i in positions})
            continue
        groups[id(decoder)] = (decoder, positions, payloads)  # positions as numpy until a value joins them
    every = len(others) == len(values)  # values that carry their schema (Connect JSON): no copy taken first
    other_values = (values if every else values.take(pa.array(others, pa.int64()))).to_pylist()
    for i, value in zip(others.tolist(), other_values):
        if value is None and nulls_allowed:
            continue
        try:
            decoder, payload = decoders.split(value)
        except UnusableSchema as err:
            errors[i] = f"{what}: {err}"
            continue
        except ValueError as err:  # not the wire format, a tombstone
            errors[i] = f"{what}: {err}" if what != "value" else str(err)
            continue
        # Mostly a decoder of no usual frame above (a GUID, another Protobuf message type, a schema file); but
        # Protobuf's first message type may also be framed with its index path written out ([1, 0]).
        decoder_id = id(decoder)
        if decoder_id in groups and isinstance(groups[decoder_id][2], pa.Array):
            _, positions, payloads = groups[decoder_id]
            groups[decoder_id] = (decoder, positions.tolist(), payloads.to_pylist())
        group = groups.setdefault(decoder_id, (decoder, [], []))
        group[1].append(i)
        group[2].append(payload)
    merged, usable = table_type, []
    for decoder, positions, payloads in groups.values():
        try:
            merged = decoder.arrow_type if merged is None else merge_type(merged, decoder.arrow_type, "")
            usable.append((decoder, positions, payloads))
        except Incompatible as err:
            errors.update({int(i): f"{what}: {decoder.label}: {err}" for i in positions})
    if merged is None:
        return pa.nulls(len(values), pa.binary()), pa.binary(), errors
    arrays, orders = [], []
    for decoder, positions, payloads in usable:
        array, decoded = decode_group(decoder, positions, payloads, errors, what)
        arrays.append(array.cast(merged))
        orders.append(np.asarray(decoded, dtype=np.int64))
    decoded_order = np.concatenate(orders) if orders else np.empty(0, np.int64)
    if len(arrays) == 1 and len(decoded_order) == len(values) and np.array_equal(decoded_order, np.arange(len(values))):
        return arrays[0], merged, errors  # every value, in order: nothing to rearrange
    index = np.full(len(values), -1, dtype=np.int64)
    index[decoded_order] = np.arange(len(decoded_order), dtype=np.int64)
    combined = pa.concat_arrays(arrays) if arrays else pa.nulls(0, merged)
    return combined.take(pa.array(index, mask=index < 0)), merged, errors


SPLIT_AT = 4096  # a group at least this long that will not decode together is tried again in halves


def decode_group(decoder, positions, payloads, errors: dict[int, str], what: str):
    """(an array of `decoder.arrow_type`, the positions it holds): every payload of one schema. `positions`:
    a list or a numpy array of ints; `payloads`: a list of bytes or an Arrow array.

    Together when the decoder has a batch decoder (`decode_many`); a group it refuses (one corrupt
    payload refuses the whole group) is halved, down to SPLIT_AT, so that only the part around the
    payload goes record by record, where its error is worded."""
    if decoder.batches is None:
        return _decode_one_by_one(decoder, positions, payloads, errors, what)
    spans = spans_together(
        0, len(positions), lambda start, n: decoder.decode_many(payloads[start : start + n]), SPLIT_AT // 2
    )
    if len(spans) == 1 and spans[0].taken is not None:
        return spans[0].taken, positions
    arrays: list[pa.Array] = []
    held: list[int] = []
    for start, n, array in spans:
        if array is None:
            array, decoded = _decode_one_by_one(
                decoder, positions[start : start + n], payloads[start : start + n], errors, what
            )
        else:
            decoded = positions[start : start + n]
        arrays.append(array)
        held.extend(int(i) for i in decoded)
    return pa.concat_arrays(arrays), held


def _decode_one_by_one(decoder, positions, payloads, errors: dict[int, str], what: str):
    values, decoded = [], []
    if isinstance(positions, np.ndarray):
        positions = positions.tolist()  # plain ints: they key the errors
    if isinstance(payloads, pa.Array):
        payloads = payloads.to_pylist()
    for i, payload in zip(positions, payloads):
        try:
            values.append(decoder.decode(payload))
            decoded.append(i)
        except Exception as err:  # fastavro and protobuf raise many kinds on a corrupt payload
            errors[i] = f"{what}: not a valid {decoder.kind_name} record ({type(err).__name__}: {err})"[:1000]
    try:
        return pa.array(values, decoder.arrow_type), decoded
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        pass
    kept, good = [], []  # Arrow refused a value (a number out of range): find which, record by record
    for i, value in zip(decoded, values):
        try:
            pa.array([value], decoder.arrow_type)
            kept.append(value)
            good.append(i)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as err:
            errors[i] = f"{what}: {err}"
    return pa.array(kept, decoder.arrow_type), good

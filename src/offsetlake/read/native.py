"""The native reader: `native_reader.c`, built once per machine, driven by reader.RangeReader.

It makes the Arrow columns of a range straight from librdkafka's messages, with no Python object a message.
It is built with the machine's C compiler against librdkafka's headers (`librdkafka-dev`) and linked to the
librdkafka that confluent-kafka loaded, so the process keeps one librdkafka and both readers read with the
same library and settings. The build (under a second) happens at `make install`, or on the first read of a
machine that lacks it (a Spark worker elsewhere), into `~/.cache/offsetlake/native/` (a rename makes it
appear whole). Where it cannot be built or loaded (no compiler or headers, a confluent-kafka without a
shared librdkafka, a setting that is a Python callback) reader.py reads through confluent-kafka instead,
with the same results: `OFFSETLAKE_NATIVE_READER=0` asks for that everywhere.

    python -m offsetlake.read.native    # build it now; prints its path or why it cannot be built
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
from pathlib import Path
from typing import Any

import confluent_kafka
import confluent_kafka.cimpl  # loads librdkafka, which the library links to
import numpy as np
import pyarrow as pa

from offsetlake import c_libraries
from offsetlake.c_libraries import NativeUnavailable

log = logging.getLogger("offsetlake.read.native")

SOURCE = Path(__file__).with_name("native_reader.c")
HEADER = Path("/usr/include/librdkafka/rdkafka.h")
ENABLED_ENV = "OFFSETLAKE_NATIVE_READER"


class _Sizes(ctypes.Structure):
    """native_reader.c's ol_sizes: what one consume took, measured."""

    _fields_ = [
        ("cut", ctypes.c_int32),
        ("length", ctypes.c_int64),
        ("last_offset", ctypes.c_int64),
        ("error_count", ctypes.c_int64),
        ("error_texts_len", ctypes.c_int64),
        ("keys_len", ctypes.c_int64),
        ("values_len", ctypes.c_int64),
        ("header_count", ctypes.c_int64),
        ("header_names_len", ctypes.c_int64),
        ("header_values_len", ctypes.c_int64),
    ]


class _Binary(ctypes.Structure):
    _fields_ = [
        ("offsets", ctypes.c_void_p),
        ("data", ctypes.c_void_p),
        ("validity", ctypes.c_void_p),
        ("null_count", ctypes.c_int64),
    ]


class _Columns(ctypes.Structure):
    """native_reader.c's ol_columns: the buffers ol_fill fills."""

    _fields_ = [
        ("error_codes", ctypes.c_void_p),
        ("error_offsets", ctypes.c_void_p),
        ("error_texts", ctypes.c_void_p),
        ("keys", _Binary),
        ("values", _Binary),
        ("offsets", ctypes.c_void_p),
        ("timestamps", ctypes.c_void_p),
        ("timestamp_validity", ctypes.c_void_p),
        ("timestamp_null_count", ctypes.c_int64),
        ("header_offsets", ctypes.c_void_p),
        ("header_names", _Binary),
        ("header_values", _Binary),
    ]


def librdkafka_path() -> Path:
    """The librdkafka file this process loaded for confluent-kafka (read from the process's mappings)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split(maxsplit=5)[-1].strip()
            if "librdkafka" in Path(path).name and ".so" in path:
                return Path(path)
    raise NativeUnavailable(f"confluent-kafka {confluent_kafka.version()[0]} loaded no shared librdkafka")


def _identity(rdkafka: Path) -> list[str]:
    stat = rdkafka.stat()
    return [str(rdkafka), str(stat.st_size), str(stat.st_mtime_ns)]


def library_path() -> Path:
    """Where the library built from this source for this librdkafka lives."""
    return c_libraries.library_path([SOURCE], "reader", _identity(librdkafka_path()))


def build() -> Path:
    """Build the library unless it is there; its path. Raises NativeUnavailable with the reason."""
    rdkafka = librdkafka_path()
    identity = _identity(rdkafka)
    if not c_libraries.library_path([SOURCE], "reader", identity).exists() and not HEADER.exists():
        raise NativeUnavailable(f"librdkafka's headers are not installed ({HEADER}: apt-get install librdkafka-dev)")
    link = [str(rdkafka), f"-Wl,-rpath,{rdkafka.parent}", "-lpthread"]
    return c_libraries.build([SOURCE], "reader", identity, link)


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i32, i64, cstr = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_char_p
    signatures: dict[str, tuple[list, Any]] = {
        "ol_open": (
            [ctypes.POINTER(cstr), ctypes.POINTER(cstr), ctypes.c_int, cstr, i32, i64, cstr, ctypes.c_size_t],
            p,
        ),
        "ol_close": ([p], None),
        "ol_take_client_errors": ([p], p),
        "ol_free": ([p], None),
        "ol_position": ([p], i64),
        "ol_consume": ([p, i32, i32, i64, i32, ctypes.POINTER(_Sizes), cstr, ctypes.c_size_t], ctypes.c_int),
        "ol_fill": ([p, ctypes.POINTER(_Columns), ctypes.POINTER(_Sizes)], None),
    }
    for name, (argtypes, restype) in signatures.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, restype
    return lib


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library, or None (logged once, with the reason) when this process reads through
    confluent-kafka."""
    if os.environ.get(ENABLED_ENV, "1") == "0":
        return None
    try:
        return _declare(ctypes.CDLL(str(build())))
    except (NativeUnavailable, OSError) as err:
        log.warning("the native Kafka reader is not available (%s); reading through confluent-kafka", err)
        return None


def _setting(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# The Python callbacks a reader's settings carry that the native reader does itself: librdkafka's log (its
# critical lines only, as reader.py's logger) and the client errors (NativeConsumer.take_client_errors).
OWN_CALLBACKS = ("logger", "error_cb")


def usable(settings: dict[str, Any]) -> bool:
    """Whether the native reader can read with these settings here: it is built and loaded, and no setting is
    a Python callback it cannot call (an OAUTHBEARER token callback, statistics)."""
    return library() is not None and not any(callable(v) for k, v in settings.items() if k not in OWN_CALLBACKS)


class NativeConsumer:
    """One partition's consumer, assigned at `start`: the part of confluent-kafka's Consumer the reader uses.
    `settings` are a reader's (reader.reader_settings); only when `usable(settings)`."""

    def __init__(self, settings: dict[str, Any], topic: str, partition: int, start: int):
        lib = library()
        assert lib is not None, "NativeConsumer made where usable() is False"
        self._lib = lib
        settings = {k: _setting(v) for k, v in settings.items() if k not in OWN_CALLBACKS}
        names = (ctypes.c_char_p * len(settings))(*(k.encode() for k in settings))
        values = (ctypes.c_char_p * len(settings))(*(v.encode() for v in settings.values()))
        errstr = ctypes.create_string_buffer(512)
        self._handle = lib.ol_open(names, values, len(settings), topic.encode(), partition, start, errstr, 512)
        if not self._handle:
            raise NativeOpenError(errstr.value.decode(errors="replace"))

    def consume(self, wanted: int, timeout_ms: int, end: int, headers: bool) -> NativeChunk:
        """Up to `wanted` messages within `timeout_ms`, those at or past `end` left out."""
        sizes, errstr = _Sizes(), ctypes.create_string_buffer(512)
        if self._lib.ol_consume(self._handle, wanted, timeout_ms, end, int(headers), sizes, errstr, 512):
            raise NativeReadError(errstr.value.decode(errors="replace"))
        chunk = NativeChunk(sizes, headers)
        self._lib.ol_fill(self._handle, chunk.columns, sizes)
        return chunk

    def position(self) -> int:
        return int(self._lib.ol_position(self._handle))

    def take_client_errors(self) -> list[str]:
        address = self._lib.ol_take_client_errors(self._handle)
        if not address:
            return []
        try:
            return ctypes.string_at(address).decode(errors="replace").splitlines()
        finally:
            self._lib.ol_free(address)

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle:
            self._lib.ol_close(handle)


class NativeOpenError(Exception):
    """librdkafka refused a setting, or the consumer could not be made or assigned."""


class NativeReadError(Exception):
    """A consume failed as a whole (not one message's error, which a chunk carries)."""


def _allocate(size: int) -> pa.Buffer:
    return pa.allocate_buffer(max(size, 1))  # Arrow's pool: it keeps freed pages for the next chunk


class _BinaryBuffers:
    def __init__(self, length: int, data_len: int):
        self.length = length
        self.offsets, self.data = _allocate(4 * (length + 1)), _allocate(data_len)
        self.validity = _allocate((length + 7) // 8)

    def into(self, b: _Binary) -> None:
        b.offsets, b.data, b.validity = self.offsets.address, self.data.address, self.validity.address

    def array(self, b: _Binary, arrow_type: pa.DataType) -> pa.Array:
        nulls = int(b.null_count)
        validity = self.validity if nulls else None
        return pa.Array.from_buffers(arrow_type, self.length, [validity, self.offsets, self.data], null_count=nulls)


_BINARY = pa.binary()


class NativeChunk:
    """What one consume returned: the kept messages' columns in buffers of Arrow's, and the errors among them
    (`errors`: code, offset and text of each, in order)."""

    def __init__(self, sizes: _Sizes, headers: bool):
        self.length, self.cut = int(sizes.length), bool(sizes.cut)
        self.last_offset = int(sizes.last_offset) if self.length else None
        n, errors = self.length, int(sizes.error_count)
        self._error_codes, self._error_offsets = _allocate(4 * errors), _allocate(8 * errors)
        self._error_texts = _allocate(int(sizes.error_texts_len))
        self._keys, self._values = _BinaryBuffers(n, int(sizes.keys_len)), _BinaryBuffers(n, int(sizes.values_len))
        self._offsets, self._timestamps = _allocate(8 * n), _allocate(8 * n)
        self._timestamp_validity = _allocate((n + 7) // 8)
        c = self.columns = _Columns()
        c.error_codes, c.error_offsets = self._error_codes.address, self._error_offsets.address
        c.error_texts = self._error_texts.address
        self._keys.into(c.keys)
        self._values.into(c.values)
        c.offsets, c.timestamps = self._offsets.address, self._timestamps.address
        c.timestamp_validity = self._timestamp_validity.address
        if headers:
            count = int(sizes.header_count)
            self._header_offsets = _allocate(4 * (n + 1))
            self._header_names = _BinaryBuffers(count, int(sizes.header_names_len))
            self._header_values = _BinaryBuffers(count, int(sizes.header_values_len))
            c.header_offsets = self._header_offsets.address
            self._header_names.into(c.header_names)
            self._header_values.into(c.header_values)
        self._error_count = errors

    @property
    def errors(self) -> list[tuple[int, int, str]]:
        if not self._error_count:
            return []
        codes = np.frombuffer(self._error_codes, np.int32, count=self._error_count)
        offsets = np.frombuffer(self._error_offsets, np.int64, count=self._error_count)
        texts = self._error_texts.to_pybytes().split(b"\0")
        return [(int(c), int(o), t.decode(errors="replace")) for c, o, t in zip(codes, offsets, texts)]

    def keys(self) -> pa.Array:
        return self._keys.array(self.columns.keys, _BINARY)

    def values(self) -> pa.Array:
        return self._values.array(self.columns.values, _BINARY)

    def offsets(self) -> pa.Array:
        return pa.Array.from_buffers(pa.int64(), self.length, [None, self._offsets])

    def timestamps(self, arrow_type: pa.DataType) -> pa.Array:
        nulls = int(self.columns.timestamp_null_count)
        validity = self._timestamp_validity if nulls else None
        return pa.Array.from_buffers(arrow_type, self.length, [validity, self._timestamps], null_count=nulls)

    def headers(self, arrow_type: pa.MapType) -> pa.Array:
        names = self._header_names.array(self.columns.header_names, pa.string())
        names.validate(full=True)  # header names are text: confluent-kafka refuses one that is not UTF-8 too
        values = self._header_values.array(self.columns.header_values, _BINARY)
        offsets = pa.Array.from_buffers(pa.int32(), self.length + 1, [None, self._header_offsets])
        return pa.MapArray.from_arrays(offsets, names, values, type=arrow_type)


if __name__ == "__main__":
    try:
        print(build())
    except NativeUnavailable as err:
        print(f"the native Kafka reader cannot be built here: {err}", file=sys.stderr)
        sys.exit(1)

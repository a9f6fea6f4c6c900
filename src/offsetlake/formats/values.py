"""The strict coercions of a declared field's JSON value to its type, one definition shared by the json
format's reference path (records.py) and JSON Schema records (registry.py): no silent string-to-number or
number-to-string conversion."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import math
import re
from typing import Any

from offsetlake.config.columns import decimal_type

INT32 = (-(2**31), 2**31 - 1)

INT64 = (-(2**63), 2**63 - 1)
_DECIMAL_TEXT = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$")  # no spaces, `_`, NaN or Infinity
_EXACT = decimal.Context(prec=80, traps=[decimal.InvalidOperation])  # beyond any decimal(38, s) and its scale


def check_unicode(text: str) -> None:
    """A JSON escape like \\ud800 (a lone surrogate) makes a str that is not Unicode: Arrow cannot store it."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError("text holds a lone surrogate escape, which is not valid Unicode") from err


def coerce(value: Any, type_: str) -> Any:
    """Strict: no silent string-to-number or number-to-string conversion."""
    if type_ == "string":
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {type(value).__name__}")
        check_unicode(value)
        return value
    if type_ in ("long", "int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected an integer, got {type(value).__name__}")
        low, high = INT32 if type_ == "int" else INT64
        if not low <= value <= high:
            raise OverflowError(f"integer {value} out of range for {type_}")
        return value
    if type_ in ("double", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"expected a number, got {type(value).__name__}")
        if not math.isfinite(float(value)):
            raise ValueError("number is not finite")
        return float(value)
    if type_ == "boolean":
        if not isinstance(value, bool):
            raise TypeError(f"expected true or false, got {type(value).__name__}")
        return value
    if type_ == "timestamp":
        return timestamp(value)
    if type_ == "date":
        if not isinstance(value, str):
            raise TypeError(f"expected a date string YYYY-MM-DD, got {type(value).__name__}")
        return dt.date.fromisoformat(value)
    if type_ == "binary":
        if not isinstance(value, str):
            raise TypeError(f"expected base64 text, got {type(value).__name__}")
        return base64.b64decode(value, validate=True)
    declared = decimal_type(type_)
    if declared is not None:
        return to_decimal(value, *declared)
    raise TypeError(f"unsupported type {type_}")


def from_unscaled(unscaled: int, scale: int) -> decimal.Decimal:
    """`unscaled` × 10^-`scale`, exactly, at that scale. Built from text: Decimal's arithmetic (`scaleb`
    included) rounds to its context's 28 significant digits, and a decimal(38, s) or a PostgreSQL numeric
    has more."""
    return decimal.Decimal(f"{unscaled}E{-scale}")


@functools.lru_cache(maxsize=64)
def to_decimal(value: Any, precision: int, scale: int) -> decimal.Decimal:
    """Decimal text (exact), or a JSON number (read as a double: exact to 15 significant digits), at `scale`.
    Never rounded: more decimal places than the scale, or more digits before the point than the precision
    leaves room for, is refused."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(f"expected a decimal as text or a number, got {type(value).__name__}")
    if isinstance(value, str):
        if not _DECIMAL_TEXT.match(value):
            raise ValueError(f"{value[:40]!r} is not a decimal number")
        exact = decimal.Decimal(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("number is not finite")
        exact = decimal.Decimal(repr(value))  # the shortest text that reads back as this double
    else:
        exact = decimal.Decimal(value)
    declared = f"decimal({precision},{scale})"
    try:
        scaled = exact.quantize(decimal.Decimal(1).scaleb(-scale), context=_EXACT)
    except decimal.InvalidOperation as err:
        raise OverflowError(f"{value} out of range for {declared}") from err
    if scaled != exact:
        raise ValueError(f"{value} has more than {scale} decimal places, the scale of {declared}")
    if scaled and scaled.adjusted() >= precision - scale:
        raise OverflowError(f"{value} out of range for {declared}")
    return scaled


def timestamp(value: Any) -> dt.datetime:
    """ISO 8601 text (naive means UTC) or epoch milliseconds."""
    if isinstance(value, bool):
        raise TypeError("expected a timestamp, got bool")
    if isinstance(value, (int, float)):
        try:
            return dt.datetime.fromtimestamp(value / 1000.0, tz=dt.UTC)
        except (OverflowError, OSError, ValueError) as err:  # OSError: the C library's "value too large"
            raise OverflowError(f"epoch milliseconds {value} out of range for a timestamp") from err
    if not isinstance(value, str):
        raise TypeError(f"expected a timestamp, got {type(value).__name__}")
    parsed = dt.datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)

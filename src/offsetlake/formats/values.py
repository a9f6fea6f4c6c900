"""The strict coercions of a declared field's JSON value to its type, one definition shared by the json
format's reference path (records.py) and JSON Schema records (registry.py): no silent string-to-number or
number-to-string conversion."""

from __future__ import annotations

import base64
import datetime as dt
import math

INT32 = (-(2**31), 2**31 - 1)

INT64 = (-(2**63), 2**63 - 1)


def check_unicode(text: str) -> None:
    """A JSON escape like \\ud800 (a lone surrogate) makes a str that is not Unicode: Arrow cannot store it."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("text holds a lone surrogate escape, which is not valid Unicode") from None


def coerce(value, type_: str):
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
    raise TypeError(f"unsupported type {type_}")


def timestamp(value) -> dt.datetime:
    """ISO 8601 text (naive means UTC) or epoch milliseconds."""
    if isinstance(value, bool):
        raise TypeError("expected a timestamp, got bool")
    if isinstance(value, (int, float)):
        try:
            return dt.datetime.fromtimestamp(value / 1000.0, tz=dt.UTC)
        except (OverflowError, OSError, ValueError):  # OSError: the C library's "value too large"
            raise OverflowError(f"epoch milliseconds {value} out of range for a timestamp") from None
    if not isinstance(value, str):
        raise TypeError(f"expected a timestamp, got {type(value).__name__}")
    parsed = dt.datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)

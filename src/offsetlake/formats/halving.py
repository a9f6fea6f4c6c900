"""Decoding a run of records together, and halving a run that will not decode together.

A vectorised decoder refuses a whole run for one bad record. Halving the refused run, while each half
keeps at least `least` records, leaves only the part around the bad record to go one by one (where its
error is worded), and the rest stays fast. The JSON reader and the registry formats both use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, TypeVar

T = TypeVar("T")


class Span(NamedTuple):
    """Records `start` to `start + length` of a run, and what `together` made of them (None: refused)."""

    start: int
    length: int
    taken: object | None


def spans_together(start: int, length: int, together: Callable[[int, int], T | None], least: int) -> list[Span]:
    """The spans covering `start`..`start + length`, in order: each either decoded by `together(start,
    length)` or (taken None) left for the record-by-record path; a refused span is halved while both
    halves hold at least `least` records."""
    taken = together(start, length)
    if taken is not None:
        return [Span(start, length, taken)]
    if length >= 2 * least:
        half = length // 2
        return spans_together(start, half, together, least) + spans_together(
            start + half, length - half, together, least
        )
    return [Span(start, length, None)]

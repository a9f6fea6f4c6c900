"""An offset range: what a batch plans, a task reads, a commit records, a backfill replaces."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int  # exclusive

    @property
    def size(self) -> int:
        return self.end - self.start

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] [{self.start}, {self.end})"

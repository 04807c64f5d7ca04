"""Interval maths over [start, end) datetime pairs: where the billing clock ran and which of it is credited."""

from __future__ import annotations

from datetime import datetime

Interval = tuple[datetime, datetime]


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out = []
    for a0, a1 in a:
        for b0, b1 in b:
            start, end = max(a0, b0), min(a1, b1)
            if end > start:
                out.append((start, end))
    return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out = list(a)
    for b0, b1 in b:
        next_out = []
        for a0, a1 in out:
            if b1 <= a0 or b0 >= a1:
                next_out.append((a0, a1))
                continue
            if a0 < b0:
                next_out.append((a0, b0))
            if b1 < a1:
                next_out.append((b1, a1))
        out = next_out
    return out


def seconds_in(intervals: list[Interval]) -> int:
    return int(sum((end - start).total_seconds() for start, end in intervals))

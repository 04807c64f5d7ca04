"""Timing helpers of the fleet measures: a figure beside its floor and their ratio, a block always rolled back,
and one call timed."""

from __future__ import annotations

import time
from contextlib import contextmanager

from django.db import transaction


def in_ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def with_floor(name: str, value: float, floor: float, *, ms: bool = False) -> dict:
    """`name`, `name_floor` and `name_ratio` (in ms when `ms`, else seconds). The ratio is that of the figures
    as printed, so a reader who divides the two numbers of the line gets it (a floor of a few milliseconds
    printed to 3 decimals in seconds would otherwise disagree with the ratio by more than its rounding)."""
    shown = in_ms if ms else (lambda s: round(s, 3))
    value, floor = shown(value), shown(floor)
    return {
        name: value,
        f"{name}_floor": floor,
        f"{name}_ratio": round(value / floor, 2) if floor else None,
    }


class _Rollback(Exception):
    pass


@contextmanager
def rolled_back():
    """Run the block in a transaction that is always rolled back (nothing it writes stays)."""
    try:
        with transaction.atomic():
            yield
            raise _Rollback
    except _Rollback:
        pass


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started

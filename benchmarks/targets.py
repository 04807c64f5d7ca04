"""The targets a benchmark checks, and the block every `bench NAME` prints with its figures.

A target compares one figure of the result with a bound: `approved == units`, `first_sync_s <= 5`.
Its kind says what a miss means:

- correctness: the benchmark's reason to exist (counts approved, samples lost or duplicated, double
  allocations, errors, query counts that must not grow). Exact on any machine and at any size, so the CI
  smoke (`bench smoke`) checks these and nothing else;
- performance: timings, throughput and ratios, which depend on the machine, its load and the size run.

`block(result, targets)` gives `{"targets": {name: {"value", "target", "met", "kind"}}, "correctness_met",
"targets_met"}`. A figure the result lacks is a miss (value null): a benchmark that stops reporting what it
measured fails instead of passing quietly. A target with `when` applies only to results it accepts (a
figure that exists only for some options).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

CORRECTNESS = "correctness"
PERFORMANCE = "performance"

OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}


@dataclass(frozen=True)
class Expr:
    """A value computed from the result, named as it appears in the target's name."""

    label: str
    compute: Callable[[dict], Any]

    def __str__(self) -> str:
        return self.label


Side = str | int | float | Expr  # a figure's dotted path, a number, or an Expr


@dataclass(frozen=True)
class Target:
    figure: str | Expr
    op: str
    bound: Side
    kind: str
    when: Callable[[dict], bool] | None = None

    def __post_init__(self) -> None:
        if self.op not in OPERATORS:
            raise ValueError(f"unknown operator {self.op!r}; use one of {', '.join(OPERATORS)}")

    @property
    def name(self) -> str:
        return f"{self.figure} {self.op} {self.bound}"

    def applies(self, result: dict) -> bool:
        return self.when is None or bool(self.when(result))

    def check(self, result: dict) -> dict:
        value, bound = _resolve(self.figure, result), _resolve(self.bound, result)
        met = value is not None and bound is not None and OPERATORS[self.op](value, bound)
        return {"value": value, "target": bound, "met": met, "kind": self.kind}


def correctness(figure: str | Expr, op: str, bound: Side, *, when=None) -> Target:
    return Target(figure, op, bound, CORRECTNESS, when)


def performance(figure: str | Expr, op: str, bound: Side, *, when=None) -> Target:
    return Target(figure, op, bound, PERFORMANCE, when)


def figure(result: dict, path: str) -> Any:
    """`a.b.c` read from nested dicts; None where any step is missing."""
    value: Any = result
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _resolve(side: Side, result: dict) -> Any:
    if isinstance(side, Expr):
        try:
            value = side.compute(result)
        except (KeyError, TypeError, ArithmeticError, ValueError):
            return None  # a figure it needs is missing or null
    elif isinstance(side, str):
        value = figure(result, side)
    else:
        value = side
    return float(value) if isinstance(value, Decimal) else value


def block(result: dict, targets: list[Target]) -> dict:
    """The targets a result is checked against, each with its value, and whether they are met."""
    checked = {t.name: t.check(result) for t in targets if t.applies(result)}
    return {
        "targets": checked,
        "correctness_met": all(c["met"] for c in checked.values() if c["kind"] == CORRECTNESS),
        "targets_met": all(c["met"] for c in checked.values()),
    }


def unmet(checked: dict, kind: str = CORRECTNESS) -> list[str]:
    """`name (value V, target T)` for each unmet target of `kind` in a printed block."""
    return [
        f"{name} (value {c['value']}, target {c['target']})"
        for name, c in checked.get("targets", {}).items()
        if c["kind"] == kind and not c["met"]
    ]

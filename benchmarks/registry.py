"""Registry behind `python manage.py bench NAME`: each module of this package (and its sub-packages) registers its
benchmarks.

A benchmark is a function taking the parsed options and returning a dict; the command prints it
as one JSON object on the last line, with the block of the targets it declares (benchmarks.targets).
`smoke` gives the small arguments `bench smoke` runs it with in CI, or why it is left out there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module

from .targets import Target


@dataclass(frozen=True)
class Smoke:
    """How `bench smoke` runs a benchmark: small arguments, the services it needs, or why it is skipped."""

    args: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # "postgresql", "redis": skipped, with the reason printed, without them
    skip: str = ""  # never run in the smoke, for this reason


@dataclass
class Benchmark:
    name: str
    run: Callable[..., dict]
    help: str
    arguments: list[tuple[tuple, dict]] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    smoke: Smoke = field(default_factory=Smoke)


REGISTRY: dict[str, Benchmark] = {}


def benchmark(
    name: str,
    help: str,
    arguments: list[tuple[tuple, dict]] | None = None,
    *,
    targets: list[Target],
    smoke: Smoke,
):
    """Register `fn(**options) -> dict` as benchmark NAME; arguments are argparse (args, kwargs) pairs.

    Every benchmark states its targets (at least one correctness target) and how the smoke runs it."""

    def wrap(fn):
        REGISTRY[name] = Benchmark(name, fn, help, arguments or [], targets, smoke)
        return fn

    return wrap


def arg(*args, **kwargs) -> tuple[tuple, dict]:
    return args, kwargs


MODULES = (
    "capacity",
    "mig.planner",
    "mig.reconfigure",
    "mig.maintenance",
    "pools",
    "billing",
    "monitoring",
    "dashboard",
    "fleet.screens",
    "demo_soak",
    "dedication.dra",
    "queueing",
    "queueing.procurement",
    "dedication",
    "monitoring.poll_cycle",
    "api_schema",
    "mutation",
    "fleet",
    "smoke",
)


def load() -> dict[str, Benchmark]:
    """Import every benchmark module (each registers itself); the registry by name."""
    for module in MODULES:
        import_module(f"{__package__}.{module}")
    return REGISTRY

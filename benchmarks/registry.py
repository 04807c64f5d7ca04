"""Registry behind `python manage.py bench NAME`: each module of this package registers its benchmarks.

A benchmark is a function taking the parsed options and returning a dict; the command prints it
as one JSON object on the last line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module


@dataclass
class Benchmark:
    name: str
    run: Callable[..., dict]
    help: str
    arguments: list[tuple[tuple, dict]] = field(default_factory=list)


REGISTRY: dict[str, Benchmark] = {}


def benchmark(name: str, help: str, arguments: list[tuple[tuple, dict]] | None = None):
    """Register `fn(**options) -> dict` as benchmark NAME; arguments are argparse (args, kwargs) pairs."""

    def wrap(fn):
        REGISTRY[name] = Benchmark(name, fn, help, arguments or [])
        return fn

    return wrap


def arg(*args, **kwargs) -> tuple[tuple, dict]:
    return args, kwargs


MODULES = (
    "capacity",
    "mig_planner",
    "mig_reconfigure",
    "pools",
    "billing",
    "monitoring",
    "dashboard",
    "demo_soak",
    "dra_check",
    "queueing",
    "dedication",
    "poll_cycle",
    "api_schema",
)


def load() -> dict[str, Benchmark]:
    """Import every benchmark module (each registers itself); the registry by name."""
    for module in MODULES:
        import_module(f"{__package__}.{module}")
    return REGISTRY

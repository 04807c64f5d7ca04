"""Registry behind `python manage.py bench NAME`: each app's benchmarks.py registers its benchmarks.

A benchmark is a function taking the parsed options and returning a dict; the command prints it
as one JSON object on the last line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


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

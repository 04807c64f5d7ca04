"""pytest plugin for `bench mutation`'s test processes (`-p benchmarks.mutation.db --reuse-db`).

Points the test database at GPUAAS_MUTATION_TEST_DB, a file the benchmark copies from a template migrated once
per run, so each mutant's pytest process reuses it (pytest-django's --reuse-db) instead of migrating again.
Also loads a Hypothesis profile without the shrink phase: a mutant is killed by the first failing example, and
shrinking it (hundreds of further examples) would only make the run slower. Nothing else loads this plugin.

Coverage-guided selection (benchmarks/mutation/selection.py):
- GPUAAS_MUTATION_COVER=<data file>|<source file>: measure the source file under coverage.py with one context
  per test (its node id, around setup, call and teardown, as pytest-cov's `--cov-context=test` does), and write
  the node ids pytest ran, in order, to <data file>.order, and each test's seconds (setup, call and teardown) to
  <data file>.seconds as `node id<TAB>seconds` lines, from which a mutant's timeout is sized.
- GPUAAS_MUTATION_SELECT=<file of node ids>: run only those of the collected tests (the others are deselected).

GPUAAS_MUTATION_MODULES=<file>: at the end, write the names of the imported modules from outside the project
(the directory pytest ran in), in import order: what benchmarks/mutation/fork.py's warm parent imports once.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

_coverage = None
_modules: dict = {}
_seconds: dict[str, float] = {}


def pytest_configure(config) -> None:
    from hypothesis import Phase, settings

    settings.register_profile("gpuaas-mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate])
    settings.load_profile("gpuaas-mutation")
    cover = os.environ.get("GPUAAS_MUTATION_COVER")
    if cover:
        import coverage

        global _coverage
        data_file, source_file = cover.split("|", 1)
        _coverage = coverage.Coverage(data_file=data_file, include=[source_file], config_file=False)
        _coverage.start()


def pytest_sessionstart(session) -> None:
    path = os.environ.get("GPUAAS_MUTATION_TEST_DB")
    if not path:
        return
    from django.db import connections

    connections["default"].settings_dict.setdefault("TEST", {})["NAME"] = path


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    select = os.environ.get("GPUAAS_MUTATION_SELECT")
    if not select:
        return
    wanted = set(Path(select).read_text().splitlines())
    kept = [item for item in items if item.nodeid in wanted]
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
    items[:] = kept


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _coverage is None:
        yield
        return
    _forget_cached_answers()
    _coverage.switch_context(item.nodeid)
    started = time.perf_counter()
    try:
        yield
    finally:
        _seconds[item.nodeid] = time.perf_counter() - started
        _coverage.switch_context("")


def _forget_cached_answers() -> None:
    """Empty the measured module's own caches (functools.lru_cache) before each test while coverage measures.

    Otherwise a test that reads an answer an earlier test cached would not run the lines that compute it, and
    would not be selected for a mutant of them, though the mutant's answer is what it reads."""
    source = os.path.realpath(os.environ["GPUAAS_MUTATION_COVER"].split("|", 1)[1])
    if source not in _modules:  # found once: the module is imported before the first test runs
        found = (m for m in list(sys.modules.values()) if getattr(m, "__file__", None))
        _modules[source] = next((m for m in found if os.path.realpath(m.__file__) == source), None)
    for value in vars(_modules[source] or object()).values():
        if callable(getattr(value, "cache_clear", None)):
            value.cache_clear()


def pytest_sessionfinish(session) -> None:
    modules = os.environ.get("GPUAAS_MUTATION_MODULES")
    if modules:
        Path(modules).write_text("\n".join(_outside_modules(os.path.realpath(os.getcwd()))))
    if _coverage is None:
        return
    _coverage.stop()
    _coverage.save()
    data_file = os.environ["GPUAAS_MUTATION_COVER"].split("|", 1)[0]
    Path(data_file + ".order").write_text("\n".join(item.nodeid for item in session.items))
    Path(data_file + ".seconds").write_text("".join(f"{nodeid}\t{s:.4f}\n" for nodeid, s in _seconds.items()))


def _outside_modules(root: str) -> list[str]:
    """Names of the imported modules whose files all lie outside `root` (a package's __path__ counts too)."""
    out = []
    for name, module in list(sys.modules.items()):
        if name == "__main__" or module is None:
            continue
        files = [getattr(module, "__file__", None), *list(getattr(module, "__path__", None) or [])]
        if any(f and os.path.realpath(f).startswith(root + os.sep) for f in files):
            continue
        out.append(name)
    return out

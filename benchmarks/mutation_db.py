"""pytest plugin for `bench mutation`'s test processes (`-p benchmarks.mutation_db --reuse-db`).

Points the test database at GPUAAS_MUTATION_TEST_DB, a file the benchmark copies from a template migrated once
per run, so each mutant's pytest process reuses it (pytest-django's --reuse-db) instead of migrating again.
Also loads a Hypothesis profile without the shrink phase: a mutant is killed by the first failing example, and
shrinking it (hundreds of further examples) would only make the run slower. Nothing else loads this plugin.
"""

from __future__ import annotations

import os


def pytest_configure(config) -> None:
    from hypothesis import Phase, settings

    settings.register_profile("gpuaas-mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate])
    settings.load_profile("gpuaas-mutation")


def pytest_sessionstart(session) -> None:
    path = os.environ.get("GPUAAS_MUTATION_TEST_DB")
    if not path:
        return
    from django.db import connections

    connections["default"].settings_dict.setdefault("TEST", {})["NAME"] = path

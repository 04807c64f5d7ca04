"""`python manage.py bench smoke`: every benchmark at a small size, checked on its correctness targets only.

Each benchmark's `Smoke` (benchmarks.registry) gives its small arguments. They run one after the other,
each as its own `manage.py bench NAME ARGS` process (the command a user runs, its targets block included),
against one throwaway migrated database made for the smoke (benchmarks.pools.bench_database), so the
configured database is never written and need not be migrated. A benchmark passes when its last line says
`correctness_met`; timings are printed, never checked. One that needs PostgreSQL or Redis is skipped, with
the reason printed, where they are not configured; one whose Smoke says `skip` is never run here.

CI runs it as `make bench-smoke` on PostgreSQL and Redis (.ci/run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from django.conf import settings
from django.db import connection

from .monitoring import poll_fleet
from .pools import CLONE_ENV, bench_database
from .registry import REGISTRY, Benchmark, Smoke, arg, benchmark
from .targets import correctness, unmet

SMOKE_TIMEOUT_S = 240


def missing_services(bench: Benchmark) -> list[str]:
    """The services `bench` needs that this configuration lacks."""
    have = {"postgresql": connection.vendor == "postgresql", "redis": settings.CELERY_BROKER_URL.startswith("redis")}
    return [need for need in bench.smoke.needs if not have[need]]


def database_url() -> str:
    """DATABASE_URL for the current connection's database (a child process then uses the same one)."""
    if connection.vendor == "sqlite":
        return f"sqlite:///{connection.settings_dict['NAME']}"
    return poll_fleet.database_url()


def run_one(bench: Benchmark, env: dict[str, str], timeout_s: float) -> dict:
    """`manage.py bench NAME ARGS` in a process of its own; {"seconds", "failures", "line"}."""
    command = [sys.executable, str(settings.BASE_DIR / "manage.py"), "bench", bench.name, *bench.smoke.args]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"seconds": round(time.perf_counter() - started, 1), "failures": [f"timed out after {timeout_s:.0f} s"]}
    seconds = round(time.perf_counter() - started, 1)
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return {"seconds": seconds, "failures": [f"exit {done.returncode}, no JSON line: {' | '.join(tail)}"]}
    failures = unmet(result)
    if "error" in result:
        failures.insert(0, f"error: {result['error']}")
    if done.returncode != 0 and not failures:
        failures.append(f"exit {done.returncode}: {done.stderr.strip()[-300:]}")
    if not result.get("targets"):
        failures.append("no targets checked")
    return {"seconds": seconds, "failures": failures, "checked": sorted(result.get("targets", {}))}


@benchmark(
    "smoke",
    help="Every benchmark at a small size, on its correctness targets only (CI: make bench-smoke).",
    arguments=[
        arg("--only", default="", help="Comma-separated benchmark names (default: all)."),
        arg("--timeout", type=float, default=SMOKE_TIMEOUT_S, help="Seconds one benchmark may take."),
    ],
    targets=[correctness("failed", "==", 0), correctness("ran", ">=", 1)],
    smoke=Smoke(skip="it is the smoke"),
)
def smoke(*, stdout, only: str = "", timeout: float = SMOKE_TIMEOUT_S, **_) -> dict:
    names = [n.strip() for n in only.split(",") if n.strip()] or sorted(REGISTRY)
    unknown = sorted(set(names) - set(REGISTRY))
    if unknown:
        return {"error": f"unknown benchmark(s): {', '.join(unknown)}"}
    started = time.perf_counter()
    outcomes: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    with bench_database(suffix="smoke"):  # migrated once; each benchmark runs on a copy of it
        for name in names:
            bench = REGISTRY[name]
            missing = missing_services(bench)
            if bench.smoke.skip or missing:
                skipped[name] = bench.smoke.skip or f"needs {' and '.join(missing)}"
                stdout.write(f"smoke: {name} skipped: {skipped[name]}")
                continue
            with bench_database(suffix="run", clone=True):
                env = {
                    **os.environ,
                    "DATABASE_URL": database_url(),
                    "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
                    CLONE_ENV: "1",  # its own throwaway databases are copies of this fresh one too
                }
                connection.close()  # the child uses the database; this process waits
                outcome = outcomes[name] = run_one(bench, env, timeout)
            if outcome["failures"]:
                for failure in outcome["failures"]:
                    stdout.write(f"smoke: FAILED {name} ({' '.join(bench.smoke.args)}): {failure}")
            else:
                stdout.write(f"smoke: ok {name} in {outcome['seconds']} s ({len(outcome['checked'])} targets)")
    failed = {name: o["failures"] for name, o in outcomes.items() if o["failures"]}
    return {
        "benchmark": "smoke",
        "database": connection.vendor,
        "ran": len(outcomes),
        "failed": len(failed),
        "failures": failed,
        "skipped": skipped,
        "seconds_by_benchmark": {name: o["seconds"] for name, o in outcomes.items()},
        "seconds": round(time.perf_counter() - started, 1),
    }

"""`bench queue`'s demand and clock: the month of arrivals (generate()), the replay's clock and grid, the
Kubernetes stand-in that borrowing reads, and commits that do not wait for the disk."""

from __future__ import annotations

import datetime as dt
import math
import random
from dataclasses import dataclass

from django.db import connection

from capacity.adapters.kubernetes.objects import Pod

# workload type: (share of arrivals, sizes (GPUs), median hold h, sigma of log hold, share with an end date,
#                 SM activity range)
MIX = {
    "inference": (0.35, (1, 2, 4), 48.0, 0.8, 0.7, (0.4, 0.8)),
    "training": (0.25, (4, 8), 24.0, 0.8, 0.4, (0.7, 0.95)),
    "staging": (0.20, (1, 2), 12.0, 0.7, 0.5, (0.1, 0.4)),
    "development": (0.20, (1,), 6.0, 0.7, 0.8, (0.05, 0.3)),
}
IDLE_SHARE = 0.15  # of pools that sit idle (2% SM activity), as the idle detector finds in the demo
IDLE_ACTIVITY = 0.02
# An idle pool's need comes back after this share of its hold (uniform); at or past 1, never before release.
NEED_BACK = (0.3, 1.5)
OFFERED_LOAD = 0.95  # mean GPU-hours asked per hour, over the fleet's GPUs
PROJECTS = 20
START = dt.datetime(2026, 11, 2, tzinfo=dt.UTC)
# Planner statistics are refreshed this often (simulated hours) on PostgreSQL, as autovacuum would in production.
ANALYZE_EVERY_H = 6
POLICIES = ("refuse", "queue", "queue+borrowing")
BOUNDS_DRAWS = 50  # draws per forecast for --forecast-bounds' partly known futures


@dataclass(frozen=True)
class Arrival:
    at: dt.datetime
    project: int
    workload: str
    size: int
    hold_h: float
    declared: bool
    activity: float
    need_back_h: float | None = None  # idle pools: hours after its start when the lender needs its units again
    busy_activity: float = 0.0  # idle pools: SM activity once the need is back


def generate(*, gpus: int, days: int, seed: int) -> list[Arrival]:
    """A month of arrivals: a Poisson process with a daily cycle, sized to offer OFFERED_LOAD of the fleet.

    The idle pools' need-back times come from a second generator, so the arrivals are the same as
    before borrowing was modelled.
    """
    rng = random.Random(seed)
    lender_rng = random.Random(f"{seed}-lenders")
    kinds = list(MIX)
    weights = [MIX[k][0] for k in kinds]
    mean_gpu_h = sum(
        MIX[k][0] * (sum(MIX[k][1]) / len(MIX[k][1])) * MIX[k][2] * math.exp(MIX[k][3] ** 2 / 2) for k in kinds
    )
    rate = OFFERED_LOAD * gpus / mean_gpu_h  # arrivals per hour
    arrivals, t = [], 0.0
    while True:
        t += rng.expovariate(rate * 1.5)  # thinning: accept by the daily cycle (mean 2/3 of the peak)
        if t >= days * 24:
            return arrivals
        if rng.random() > (1 + 0.5 * math.sin(2 * math.pi * (t % 24 - 6) / 24)) / 1.5:
            continue
        kind = rng.choices(kinds, weights)[0]
        _, sizes, median, sigma, declared, activity = MIX[kind]
        idle = rng.random() < IDLE_SHARE
        project, size = rng.randrange(PROJECTS), rng.choice(sizes)  # the draws in their original order
        hold_h = max(0.25, rng.lognormvariate(math.log(median), sigma))
        has_end = rng.random() < declared
        need_back_h, busy = None, 0.0
        if idle:
            share, busy = lender_rng.uniform(*NEED_BACK), lender_rng.uniform(*activity)
            need_back_h = hold_h * share if share < 1 else None
        arrivals.append(
            Arrival(
                at=START + dt.timedelta(hours=t),
                project=project,
                workload=kind,
                size=size,
                hold_h=hold_h,
                declared=has_end,
                activity=IDLE_ACTIVITY if idle else rng.uniform(*activity),
                need_back_h=need_back_h,
                busy_activity=busy,
            )
        )


class Clock:
    def __init__(self):
        self.now = START

    def __call__(self) -> dt.datetime:
        return self.now


def hours_between(a: dt.datetime, b: dt.datetime) -> float:
    return max(0.0, (b - a).total_seconds() / 3600)


def on_grid(at: dt.datetime, period_s: int) -> dt.datetime:
    """The first beat tick at or after `at`, on a grid of `period_s` from START."""
    elapsed = (at - START).total_seconds()
    return START + dt.timedelta(seconds=math.ceil(elapsed / period_s) * period_s)


class LenderPods:
    """Stands in for the Kubernetes client reconcile_loans() reads: a Pending pod for the lent resource
    in each namespace whose lender needs its units back; no pods to evict (evictions are not replayed)."""

    def __init__(self):
        self.pending: set[str] = set()

    def __call__(self, cluster):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def list_pods(self, namespace: str = "", **_) -> list[Pod]:
        if namespace not in self.pending:
            return []
        return [Pod(namespace, "lender", "", "", "Pending", {}, {}, {"nvidia.com/gpu": 1}, None, False)]

    def list_pods_on_node(self, node_name: str, namespace: str = "", **_) -> list[Pod]:
        return []

    def evict_pod(self, namespace: str, name: str, **_) -> None:  # pragma: no cover - never called: no pods
        raise AssertionError("no borrower pods exist in the replay")


def unsynced_commits() -> None:
    """Commit without waiting for the disk, on this connection to the throwaway database (nothing in it has to
    survive a crash): a replay commits thousands of transactions, one per event or more, and on this shared
    machine each fsync took ~20 ms (a seventh of a replay's time in a profile). What is committed, and when, is
    unchanged. Inside a transaction (a test's) nothing is committed: left as it is (SQLite refuses the change)."""
    if connection.in_atomic_block:
        return
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA synchronous = OFF")
        elif connection.vendor == "postgresql":
            cursor.execute("SET synchronous_commit TO OFF")

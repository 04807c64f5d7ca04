"""What holds the units a request waits for, and for how long: the holders of its spec now, and the hold times
seen (a Kaplan-Meier survival curve per project and workload type) that a draw's releases are drawn from."""

from __future__ import annotations

import bisect
import datetime as dt
import random
from collections import defaultdict
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from capacity.choices import SpecKind
from pools.models import HOLDING_STATES, Allocation, GpuPool, PoolRequest


@dataclass(frozen=True)
class Holder:
    units: int
    end_at: dt.datetime | None
    held_h: float
    history: Survival | None  # for a pool without an end date
    nodes: tuple[tuple[int, int], ...] = ()  # (node id, units there)
    pool_id: int | None = None
    project_id: int | None = None


def _matching_allocations(request: PoolRequest):
    queryset = Allocation.objects.active().filter(kind=request.spec_kind)
    if request.spec_kind in (SpecKind.MIG, SpecKind.VGPU):  # a slice or vGPU of one profile frees only its own
        queryset = queryset.filter(profile_name=request.profile_name)
    if request.product:
        queryset = queryset.filter(product=request.product)
    if request.cluster_id:
        queryset = queryset.filter(gpu__node__cluster_id=request.cluster_id)  # the unit's own cluster
    return queryset.filter(pool__request__state__in=HOLDING_STATES)


class Survival:
    """Hold times seen, as a Kaplan-Meier survival curve: released pools are ended holds, pools still held
    count as holding at least as long as so far. Without the pools still held, the history would be
    biased short (the long holds of the window have not ended yet) and every forecast optimistic."""

    def __init__(self, observations: list[tuple[float, bool]]):
        self.ended = sum(1 for _, ended in observations if ended)
        self.times: list[float] = []
        self.survival: list[float] = []
        ended_holds = sorted(h for h, ended in observations if ended)
        self.mean = sum(ended_holds) / len(ended_holds) if ended_holds else 0.0
        at_risk, alive, i = len(observations), 1.0, 0
        ordered_obs = sorted(observations, key=lambda o: (o[0], not o[1]))  # at a tie, an end before a censoring
        while i < len(ordered_obs):
            hours, deaths, leaving = ordered_obs[i][0], 0, 0
            while i < len(ordered_obs) and ordered_obs[i][0] == hours:
                deaths += ordered_obs[i][1]
                leaving += 1
                i += 1
            if deaths:
                alive *= 1 - deaths / at_risk
                self.times.append(hours)
                self.survival.append(alive)
            at_risk -= leaving

    def _alive_at(self, hours: float) -> float:
        k = bisect.bisect_right(self.times, hours)
        return self.survival[k - 1] if k else 1.0

    def remaining(self, held: float, rng: random.Random) -> float:
        """A remaining hold (hours) for a pool held `held` hours so far: drawn from the curve past `held`;
        past the last hold seen to end, the mean hold again (memoryless), but at least
        QUEUE_FORECAST_OVERDUE_H."""
        target = rng.random() * self._alive_at(held)
        k = bisect.bisect_right(self.times, held)
        for t, alive in zip(self.times[k:], self.survival[k:], strict=True):
            if alive <= target:
                return t - held
        base = max(held, self.times[-1] if self.times else 0.0)
        extra = rng.expovariate(1 / self.mean) if self.mean > 0 else 0.0
        return max(base - held + extra, settings.QUEUE_FORECAST_OVERDUE_H)


def hold_history(*, now: dt.datetime | None = None, limit: int = 500) -> dict[tuple, Survival]:
    """Hold times (hours) of the last `limit` released pools and of every pool still held, keyed (project,
    workload), (workload,) and (): a Survival each."""
    now = now or timezone.now()
    fields = ("project_id", "workload_type", "created_at", "released_at")
    released = GpuPool.objects.filter(released_at__isnull=False).order_by("-released_at").values_list(*fields)
    held = GpuPool.objects.filter(released_at__isnull=True, created_at__lte=now).values_list(*fields)
    observations: dict[tuple, list[tuple[float, bool]]] = defaultdict(list)
    for project_id, workload, created, ended in [*released[:limit], *held]:
        hours = max(0.0, ((ended or now) - created).total_seconds() / 3600)
        for key in ((project_id, workload), (workload,), ()):
            observations[key].append((hours, ended is not None))
    return {key: Survival(rows) for key, rows in observations.items()}


def hold_samples(history: dict[tuple, Survival], project_id, workload: str) -> tuple[Survival | None, str]:
    minimum = settings.QUEUE_FORECAST_MIN_SAMPLES
    scopes = (((project_id, workload), "project and workload type"), ((workload,), "workload type"), ((), "all"))
    for key, scope in scopes:
        if key in history and history[key].ended >= minimum:
            return history[key], scope
    return None, "default"


def holders(request: PoolRequest, *, now: dt.datetime, history=None) -> tuple[list[Holder], dict]:
    """Pools holding units of the request's spec: how many units, their end date or hold history."""
    history = hold_history(now=now) if history is None else history
    rows = (
        _matching_allocations(request)
        .values(
            "pool_id",
            "pool__created_at",
            "pool__request__end_at",
            "pool__project_id",
            "pool__workload_type",
            "gpu__node_id",
        )
        .annotate(n=Count("pk"))
        .order_by("pool_id", "gpu__node_id")
    )
    by_pool: dict[int, list[dict]] = defaultdict(list)
    for row in rows:
        by_pool[row["pool_id"]].append(row)
    out, scopes = [], defaultdict(int)
    for parts in by_pool.values():
        row = parts[0]
        samples, scope = (None, "end date")
        if row["pool__request__end_at"] is None:
            samples, scope = hold_samples(history, row["pool__project_id"], row["pool__workload_type"])
        scopes[scope] += 1
        held = max(0.0, (now - row["pool__created_at"]).total_seconds() / 3600)
        nodes = tuple((part["gpu__node_id"], part["n"]) for part in parts)
        units_held = sum(n for _, n in nodes)
        end_at, project = row["pool__request__end_at"], row["pool__project_id"]
        out.append(Holder(units_held, end_at, held, samples, nodes, row["pool_id"], project))
    return out, dict(scopes)


def remaining_h(holder: Holder, rng: random.Random | None) -> float:
    """A holder's remaining hold (hours): drawn from its history, else the default hold less what it held."""
    if holder.history is None:
        return max(settings.QUEUE_FORECAST_DEFAULT_HOLD_H - holder.held_h, settings.QUEUE_FORECAST_OVERDUE_H)
    return holder.history.remaining(holder.held_h, rng)

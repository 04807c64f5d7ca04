"""The estimate: what a forecast rests on (plan), its draws' P50 and P90 (quantiles), and its accuracy
against actual starts (accuracy)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone

from capacity.choices import SpecKind
from capacity.models import MaintenanceWindow
from pools import units
from pools.models import PoolRequest
from pools.models.queue import QueueEntry
from pools.units import topology

from ..policy import queue_policy
from .demand import arrivals, queue_ahead
from .history import Holder, hold_history, holders
from .timeline import Timeline, Units


@dataclass(frozen=True)
class Forecast:
    p50: dt.datetime | None
    p90: dt.datetime | None
    basis: dict = field(default_factory=dict)


def _after_maintenance(start: dt.datetime, windows: list[MaintenanceWindow]) -> dt.datetime:
    for _ in range(len(windows) + 1):  # each move may land in another window
        moved = False
        for window in windows:
            for opens, closes in window.occurrences(start):
                if opens <= start < closes:
                    start, moved = closes, True
        if not moved:
            break
    return start


def _quantile(values: list[dt.datetime | None], q: float) -> dt.datetime | None:
    """The q-quantile (nearest rank) of the draws; None ranks last (never reached)."""
    never = dt.datetime.max.replace(tzinfo=dt.UTC)
    ranked = sorted(values, key=lambda v: never if v is None else v)
    return ranked[min(len(ranked) - 1, max(0, int(round(q * len(ranked) + 0.5)) - 1))]


def _units_now(request: PoolRequest, free: int, holders: list[Holder]) -> tuple[Units, dict[int, int]]:
    """Free units (Units) and the most units one place could ever hold (node capacity) for the request."""
    per_node = request.spec_kind == SpecKind.FULL
    if not per_node:
        return Units({0: free}, False), {0: free + sum(h.units for h in holders)}
    node_free = {n: k for n, (_, k) in topology.free_by_node(units.full_candidates(request)).items()}
    capacity = dict(node_free)
    for holder in holders:
        for node, k in holder.nodes:
            capacity[node] = capacity.get(node, 0) + k
    return Units(node_free, True), capacity


@dataclass
class Plan:
    """What estimate_start draws from: the timeline (None when the answer needs no draws: `forecast`), a MIG
    reconfiguration that would make room by `reconfigured`, the maintenance windows a start moves past."""

    basis: dict
    forecast: Forecast | None = None
    timeline: Timeline | None = None
    reconfigured: dt.datetime | None = None
    windows: list = field(default_factory=list)

    def draw(self, rng: random.Random, timeline: Timeline | None = None) -> dt.datetime | None:
        """One draw's start; `timeline` replaces the plan's (`bench queue --forecast-bounds` gives it known futures)."""
        start = (timeline or self.timeline).draw(rng)
        if self.reconfigured is not None and (start is None or self.reconfigured < start):
            start = self.reconfigured
        return None if start is None else _after_maintenance(start, self.windows)


def plan(request: PoolRequest, *, now: dt.datetime, history=None) -> Plan:
    """Read what the forecast of `request` (saved or not) rests on; see the module docstring."""
    free_by_cluster = units.free_by_cluster(request)
    free = units.usable_free(request, free_by_cluster)
    waiting = queue_ahead(request, now=now)
    ahead = [w for w in waiting if w.joins_at is None]
    history = hold_history(now=now) if history is None else history
    found, scopes = holders(request, now=now, history=history)
    basis: dict = {
        "free_now": free,
        "need": request.count,
        "ahead": sum(w.count for w in ahead),
        "holders": len(found),
        "holders_by_basis": scopes,
        "reconfiguration": None,
        "maintenance_windows": 0,
    }
    if free >= request.count and not ahead:
        start = max(now, request.start_at) if request.start_at else now
        return Plan(basis, forecast=Forecast(start, start, {**basis, "why": "fits now"}))
    answer = units.verdict(request, units.FreeUnits(free_by_cluster))  # the units the tier policy withholds
    basis["withheld"] = {"units": answer.withheld, "reason": answer.reason}
    if not answer.servable:
        return Plan(basis, forecast=Forecast(None, None, {**basis, "why": f"never: {answer.refusal}"}))
    reconfigured = None
    if request.spec_kind == SpecKind.MIG and not ahead:
        hint = units.reconfiguration_hint(request, free_by_cluster)
        if hint and hint["meets_request"]:
            reconfigured = now + dt.timedelta(seconds=settings.QUEUE_FORECAST_RECONFIGURATION_S)
            basis["reconfiguration"] = hint
    windows = list(MaintenanceWindow.objects.enabled().filter(node_group=""))
    if request.cluster_id:
        windows = [w for w in windows if w.cluster_id == request.cluster_id]
    basis["maintenance_windows"] = len(windows)
    entry = QueueEntry.objects.filter(request_id=request.pk).first() if request.pk else None
    moved = entry is not None and entry.manual_rank is not None  # an operator's place: nothing overtakes it
    coming = arrivals(request, now=now, moved=moved)
    basis["arrivals_per_h"] = round(coming.rate_h, 3)
    basis["arrivals_ahead_per_h"] = round(coming.ahead_per_h, 3)
    free_units, capacity = _units_now(request, free, found)
    largest = max(capacity.values(), default=0) if free_units.per_node and request.count > 1 else sum(capacity.values())
    if largest < request.count:  # more than the fleet (or any one node) holds: never
        why = "more than the fleet holds" + (f"; {answer.withheld_sentence()}" if answer.withheld else "")
        return Plan(basis, forecast=Forecast(None, None, {**basis, "why": why}))
    if not free_units.per_node:
        found = [dataclasses.replace(h, nodes=((0, h.units),)) for h in found]
    timeline = Timeline(
        now=now,
        horizon=now + dt.timedelta(hours=settings.QUEUE_FORECAST_HORIZON_H),
        count=request.count,
        units=free_units,
        holders=found,
        ahead=waiting,
        coming=coming,
        history=history,
        aged_at=None if moved else queue_policy.aged_at(entry.queued_at if entry is not None else now),
    )
    basis["why"] = "the queue run forward over releases and arrivals"
    return Plan(basis, timeline=timeline, reconfigured=reconfigured, windows=windows)


def estimate_start(request: PoolRequest, *, now: dt.datetime | None = None, history=None) -> Forecast:
    """P50 and P90 of when `request` (saved or not) would start, and what the estimate rests on."""
    return quantiles(plan(request, now=now or timezone.now(), history=history))


def quantiles(planned: Plan, timeline: Timeline | None = None, *, n: int | None = None) -> Forecast:
    """P50 and P90 over QUEUE_FORECAST_DRAWS (or `n`) seeded draws of the plan (of `timeline`, when given)."""
    if planned.forecast is not None:
        return planned.forecast
    rng = random.Random(settings.QUEUE_FORECAST_SEED)
    draws = [planned.draw(rng, timeline) for _ in range(n or settings.QUEUE_FORECAST_DRAWS)]
    basis = dict(planned.basis)
    p50 = _quantile(draws, 0.5)
    if p50 is not None:  # how far the draws fall from their P50: the error this forecast itself expects
        basis["spread_h"] = round(
            sum(abs((d - p50).total_seconds()) / 3600 for d in draws if d is not None) / len(draws), 3
        )
    return Forecast(p50, _quantile(draws, 0.9), basis)


def accuracy(*, since: dt.datetime | None = None) -> dict:
    """Predicted (first P50) against actual start for every request approved out of the queue.

    mae_ratio is the mean absolute error over the mean actual wait, the figure `bench queue` reports.
    The actual start is the approval onto the request's own units, what the forecast predicts (it counts
    units that free for the request, never lent units, which are preemptible and promised to no one).
    A request that ran on lent units before (QueueEntry.first_on_loan_at) is scored the same way and
    counted in `ran_on_loan_first`, with its mean wait until lent units covered it (`mean_wait_to_loan_h`).
    A request that started although its first forecast found no start within QUEUE_FORECAST_HORIZON_H (P50
    None) cannot be scored: `without_forecast` counts them, so none is left out unseen.
    """
    rows = QueueEntry.objects.started()
    unscored = QueueEntry.objects.filter(request__approved_at__isnull=False, first_p50__isnull=True)
    if since is not None:
        rows = rows.filter(request__approved_at__gte=since)
        unscored = unscored.filter(request__approved_at__gte=since)
    without_forecast = unscored.count()
    errors, waits, inside_p90, loan_waits = [], [], 0, []
    for queued, p50, p90, started, on_loan in rows.values_list(
        "queued_at", "first_p50", "first_p90", "request__approved_at", "first_on_loan_at"
    ):
        errors.append(abs((started - p50).total_seconds()) / 3600)
        waits.append(max(0.0, (started - queued).total_seconds() / 3600))
        inside_p90 += p90 is not None and started <= p90
        if on_loan is not None and on_loan < started:
            loan_waits.append(max(0.0, (on_loan - queued).total_seconds() / 3600))
    if not errors:
        return {
            "started": 0,
            "mae_h": None,
            "mean_wait_h": None,
            "mae_ratio": None,
            "within_p90": None,
            "ran_on_loan_first": 0,
            "mean_wait_to_loan_h": None,
            "without_forecast": without_forecast,
        }
    mean_wait = sum(waits) / len(waits)
    mae = sum(errors) / len(errors)
    return {
        "started": len(errors),
        "mae_h": round(mae, 3),
        "mean_wait_h": round(mean_wait, 3),
        "mae_ratio": round(mae / mean_wait, 3) if mean_wait > 0 else None,
        "within_p90": round(inside_p90 / len(errors), 3),
        "ran_on_loan_first": len(loan_waits),
        "mean_wait_to_loan_h": round(sum(loan_waits) / len(loan_waits), 3) if loan_waits else None,
        "without_forecast": without_forecast,
    }

"""The replay's figures: waits, utilisation, forecast accuracy and its bounds, and the loans (a mixin of Replay,
which holds the state)."""

from __future__ import annotations

import dataclasses
import datetime as dt

from django.conf import settings

from pools.choices import RequestState
from pools.models import GpuPool, Loan, PoolRequest, QueueEntry
from scheduling import forecast

from ..pools import _percentile, double_allocated
from .demand import BOUNDS_DRAWS, hours_between


class FiguresMixin:
    """What Replay.run() reports; every attribute is Replay's."""

    def figures(self) -> dict:
        end = self.end
        waits = [hours_between(self.arrived_at[pk], at) for pk, at in self.started.items()]
        still = [
            pk
            for pk in PoolRequest.objects.filter(state=RequestState.QUEUED).values_list("pk", flat=True)
            if pk not in self.started
        ]
        waits += [hours_between(self.arrived_at[pk], end) for pk in still]
        reserved = active = 0.0
        for pk, (at, release_at) in self.own.items():
            arrival = self.by_request[pk]
            until = min(release_at, end)
            hours = hours_between(at, until) * arrival.size
            reserved += hours
            if arrival.need_back_h is not None:
                need = at + dt.timedelta(hours=arrival.need_back_h)
                active += arrival.size * (
                    hours_between(at, min(need, until)) * arrival.activity
                    + hours_between(need, until) * arrival.busy_activity
                )
            else:
                active += hours * arrival.activity
        active += self.borrowed_active_h
        ended_waiting = PoolRequest.objects.filter(state=RequestState.REJECTED, state_reason__contains="while waiting")
        result = {
            "arrivals": len(self.arrivals),
            "started": len(self.started),
            "still_waiting": len(still),
            "mean_wait_h": round(sum(waits) / len(waits), 3) if waits else 0.0,
            "p90_wait_h": round(_percentile(waits, 0.9), 3),
            "reserved_utilisation": round(active / reserved, 3) if reserved else None,
            "refused": self.refused,
            "ended_waiting": ended_waiting.count(),
            "double_allocated": double_allocated(),
            "lender_reclaim_p99_s": None,
        }
        if self.borrowing:
            result.update(self.loan_figures())
        if self.queued:
            score = forecast.accuracy()
            result["forecast_mae_ratio"] = score["mae_ratio"]
            result["forecast"] = score
        if self.bounds:
            result["forecast_bounds"] = self.forecast_bounds()
        return result

    def forecast_bounds(self) -> dict:
        """The forecast's error if it had known part of the future: each scored request's first forecast drawn
        again with the holders' real releases (exact_holds), with the arrivals that did come and their real
        holds (exact_arrivals), and with both (exact_both: what is left is the draw's model of the queue
        itself). as_drawn re-draws the plan unchanged: it must equal forecast_mae_ratio. BOUNDS_DRAWS draws
        per forecast (exact_both is one: nothing is left to chance)."""
        started = dict(
            QueueEntry.objects.started()
            .filter(request_id__in=list(self.plans))
            .values_list("request_id", "request__approved_at")
        )
        request_of_pool = dict(GpuPool.objects.values_list("pk", "request_id"))
        approved = dict(PoolRequest.objects.values_list("pk", "approved_at"))
        pk_of = {id(arrival): pk for pk, arrival in self.by_request.items()}
        order = sorted((a.at, pk_of[id(a)]) for a in self.arrivals if id(a) in pk_of)
        variants = {
            "as_drawn": (False, False),
            "exact_holds": (True, False),
            "exact_arrivals": (False, True),
            "exact_both": (True, True),
        }
        errors: dict[str, list[float]] = {name: [] for name in variants}
        inside: dict[str, int] = dict.fromkeys(variants, 0)
        waits = []
        for pk, actual in sorted(started.items()):
            planned = self.plans[pk]
            waits.append(hours_between(self.arrived_at[pk], actual))
            for name, (holds, arrivals) in variants.items():
                timeline = planned.timeline
                if timeline is not None and holds:
                    timeline = self._known_holds(timeline, request_of_pool)
                if timeline is not None and arrivals:
                    timeline = self._known_arrivals(timeline, order, approved, actual)
                n = 1 if name == "exact_both" else (None if name == "as_drawn" else BOUNDS_DRAWS)
                estimate = forecast.quantiles(planned, timeline, n=n)
                p50 = estimate.p50 or timeline.horizon  # never within the horizon: scored at the horizon
                errors[name].append(abs((actual - p50).total_seconds()) / 3600)
                inside[name] += estimate.p90 is not None and actual <= estimate.p90
        mean_wait = sum(waits) / len(waits) if waits else 0.0
        return {
            "scored": len(waits),
            "draws": BOUNDS_DRAWS,
            **{
                name: {
                    "mae_ratio": round(sum(e) / len(e) / mean_wait, 3) if mean_wait else None,
                    "within_p90": round(inside[name] / len(e), 3) if e else None,
                }
                for name, e in errors.items()
            },
        }

    def _known_holds(self, timeline: forecast.Timeline, request_of_pool: dict) -> forecast.Timeline:
        """The timeline with each holder's real release (its end date) and each request ahead's real hold."""
        holders = []
        for holder in timeline.holders:
            own = self.own.get(request_of_pool.get(holder.pool_id))
            holders.append(dataclasses.replace(holder, end_at=own[1]) if own else holder)
        ahead = [dataclasses.replace(w, hold_h=self.by_request[w.request_id].hold_h) for w in timeline.ahead]
        return dataclasses.replace(timeline, holders=holders, ahead=ahead)

    def _known_arrivals(self, timeline: forecast.Timeline, order: list, approved: dict, actual) -> forecast.Timeline:
        """The timeline with the requests that did arrive after it (to its horizon), their sizes and holds; one
        ranks ahead when the queue approved it before this request."""
        times, samples = [], []
        for at, pk in order:
            if timeline.now < at <= timeline.horizon:
                arrival, when = self.by_request[pk], approved.get(pk)
                times.append(at)
                samples.append(
                    forecast.Arrival(
                        arrival.size,
                        None,
                        arrival.workload,
                        ahead=when is not None and when < actual,
                        auto=True,
                        hold_h=arrival.hold_h,
                    )
                )
        return dataclasses.replace(timeline, coming=forecast.KnownArrivals(times, samples))

    def loan_figures(self) -> dict:
        loans = Loan.objects.all()
        back = [
            (returned - self.need_at[pool_id]).total_seconds()
            for pool_id, returned in loans.filter(
                lender_pool_id__in=list(self.need_at), returned_at__isnull=False, reclaim_requested_at__isnull=False
            ).values_list("lender_pool_id", "returned_at")
        ]
        return {
            "lender_reclaim_p99_s": round(_percentile(back, 0.99), 1) if back else None,
            "loans": loans.count(),
            "loans_reclaimed": len(back),
            "started_on_borrowed_units": len(self.started_borrowing),
            "borrowed_active_gpu_h": round(self.borrowed_active_h, 1),
            "reclaim_bound_s": settings.LENDING_RECLAIM_GRACE_S + settings.LENDING_RECONCILE_INTERVAL_S,
        }

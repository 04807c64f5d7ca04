"""Which idle units to lend, and to whom: the idle detector's flags meet the queue (docs/queue.md, Borrowing).

A unit flagged idle (monitoring/services/idle.py) for at least LENDING_IDLE_H, in a pool that lends
(GpuPool.lending_enabled) and not lent yet, is lent to the first waiting request of another project,
in queue order, whose spec it matches (kind, product, MIG profile; the request's cluster if it names
one), up to that request's count; units left after the queue go to open best-effort requests of other
projects (pools.BestEffortRequest), oldest first, the same way. The mechanism (grant, reclaim,
eviction) is pools/lending.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Count
from django.utils import timezone

from monitoring.models import IdleReservation
from policies import policy
from pools import lending
from pools.exceptions import LendingRefused
from pools.models import BestEffortRequest, Loan
from scheduling.policy import queue_policy


def lendable_flags(*, now: datetime):
    """Open idle flags whose unit has been idle at least LENDING_IDLE_H, lendable and not lent now."""
    # A flag's window covers MONITORING_IDLE_WINDOW_H of idleness at its detection; it stays open while idle.
    detected_by = now - timedelta(hours=max(0, policy("LENDING_IDLE_H") - policy("MONITORING_IDLE_WINDOW_H")))
    lent = Loan.objects.open().values("allocation_id")
    return (
        IdleReservation.objects.open()
        .filter(detected_at__lte=detected_by, allocation__released_at__isnull=True)
        .filter(allocation__pool__lending_enabled=True, allocation__pool__released_at__isnull=True)
        .exclude(allocation_id__in=lent)
        .select_related("allocation__pool__project", "allocation__gpu__node")
        .order_by("detected_at", "pk")
    )


def lend_idle(*, now: datetime | None = None) -> list[int]:
    """Lend idle units to waiting requests of other projects, then to open best-effort requests; returns the
    new loans' ids (idempotent). Best-effort requests whose `until` came are ended first."""
    now = now or timezone.now()
    lending.end_due_best_effort(now=now)
    units = [flag.allocation for flag in lendable_flags(now=now)]
    if not units:
        return []
    queued = [place.entry.request for place in queue_policy.ordered(now=now)]
    best_effort = list(BestEffortRequest.objects.servable(now).select_related("project"))
    held = _held(Loan.objects.open(), "borrower_request", queued)
    held_best_effort = _held(Loan.objects.open(), "best_effort", best_effort)
    made: list[int] = []
    served = list(held)  # queued requests holding loans already, and below those that get one
    for borrower in [*queued, *best_effort]:
        is_queued = not isinstance(borrower, BestEffortRequest)
        want = borrower.count - (held if is_queued else held_best_effort).get(borrower.pk, 0)
        for unit in list(units):
            if want <= 0:
                break
            if not _matches(unit, borrower):
                continue
            units.remove(unit)
            serves = {"request": borrower} if is_queued else {"best_effort": borrower}
            try:
                loan = lending.lend(unit, borrower.project, at=now, **serves)
            except LendingRefused:
                continue
            made.append(loan.pk)
            want -= 1
            if is_queued:
                served.append(borrower.pk)
    lending.refresh_on_loan(served, at=now)
    return made


def _held(loans, field: str, borrowers) -> dict[int, int]:
    """Open loans per served request (`field`: borrower_request or best_effort)."""
    return dict(
        loans.filter(**{f"{field}__in": [b.pk for b in borrowers]})
        .values_list(field)
        .annotate(n=Count("pk"))
        .values_list(field, "n")
    )


def _matches(unit, request) -> bool:
    if unit.project_id == request.project_id or unit.kind != request.spec_kind:
        return False
    if request.cluster_id and unit.gpu.node.cluster_id != request.cluster_id:  # the unit's cluster: pools may span
        return False
    if request.product and unit.product != request.product:
        return False
    return not request.profile_name or unit.profile_name == request.profile_name


__all__ = ["lend_idle", "lendable_flags"]

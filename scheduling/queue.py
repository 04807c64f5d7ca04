"""The fair queue: requests that chose to wait (`wait_if_full`) instead of being refused for capacity.

Order (scheduling/policy.py, QueuePolicy): entries an operator moved come first, by the rank the move gave them; then by
priority class (production, staging, development); then by fair share, the project's GPU-hours
reserved over the last QUEUE_FAIR_SHARE_WINDOW_H hours divided by its operator-set weight
(ProjectQueueWeight, default 1), lowest first; then by age (queued_at, id). Fair share orders a request
for its first QUEUE_AGED_AFTER_H hours of waiting only; after that it is served by age, ahead of every
younger request of its class (QueuePolicy.aged_at), so no stream of later arrivals starves it.

When units come free (a release, an expiry, a unit released as idle, a reconfiguration done, a node
back: services.enqueue_queue_processing() sends pools.signals.queue_pass_wanted, which scheduling.receivers
answers with a pass after commit; and the beat every QUEUE_PROCESS_INTERVAL_S)
process() walks the queue in order. A request that fits now is approved at once when an
auto-approval policy allows it (the policy is recorded on the request and in the audit); otherwise
it is flagged "can be approved now" (QueueEntry.approvable_at) for an operator. A request that does
not fit, or that waits for an operator, blocks the requests behind it that ask for the same kind of
unit (QueuePolicy.spec_key()), so smaller requests never starve a larger one of the same spec; requests for
other specs go on. Held requests keep their place and are skipped. A request whose end date came
while it waited leaves the queue (rejected, "ended while waiting").

Locking: process() locks the queued request rows (SELECT ... FOR UPDATE, in primary-key order) for
its whole pass, so concurrent passes run one after the other and each sees what the previous one
approved; each approval is itself claimed by a conditional UPDATE (services.transition), so a
request is approved exactly once however many passes run. On SQLite the write transaction
serialises passes.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from pools import services, units
from pools.choices import QueueAction, RequestState
from pools.exceptions import DomainError, InsufficientCapacity
from pools.models import GpuPool, PoolRequest
from pools.models.queue import QueueEntry, QueueEvent

from . import forecast
from .policy import queue_policy

logger = logging.getLogger(__name__)

# --- Entering the queue --------------------------------------------------------------------------


def _event(request: PoolRequest, action: str, *, actor=None, detail: str = "", policy=None, at=None) -> None:
    QueueEvent.objects.create(
        request=request,
        action=action,
        actor=services._user(actor),
        detail=detail,
        policy=policy,
        at=at or timezone.now(),
    )


def enqueue(request: PoolRequest, *, actor=None, reason: str = "") -> QueueEntry:
    """submitted -> queued, with an entry, its first forecast (kept to score it later) and an audit row."""
    now = timezone.now()
    with transaction.atomic():
        services.transition(request, RequestState.QUEUED, actor, reason or "queued: waiting for capacity")
        entry = QueueEntry.objects.create(request=request, queued_at=now)
        _event(request, QueueAction.QUEUED, actor=actor, detail=reason, at=now)
        refresh_forecast(entry, first=True)
    return entry


def after_submit(request: PoolRequest, *, now: dt.datetime | None = None) -> GpuPool | None:
    """A request was just submitted: approve it by policy when one allows and capacity is there; queue
    it when capacity is short and it chose to wait; otherwise leave it for an operator."""
    if request.state != RequestState.SUBMITTED:
        return None
    policy = queue_policy.approval_book().first_allowing(request, now)
    try:
        if policy is not None:
            return services.approve(request, actor=None, reason=f"auto-approved by policy {policy.name}", policy=policy)
        if request.wait_if_full:
            free = units.read_free(request)
            if not queue_policy.fits(request, free):
                enqueue(request, reason=f"queued: {units.shortage(request, free.by_cluster)[0]}")
    except InsufficientCapacity as exc:
        if request.wait_if_full:
            enqueue(request, reason=f"queued: {exc.message}")
    return None


def approve_or_queue(request: PoolRequest, *, actor, reason: str = "", cluster=None) -> GpuPool | None:
    """An operator's approval: the pool, or None when capacity is short and the request chose to wait
    (it is queued instead of refused). Approving a queued request takes it out of the queue.

    A queued-instead approval is remembered on the entry (operator_approved_at/by): when capacity frees,
    process() approves the request in the operator's name even where no auto-approval policy allows it.
    """
    try:
        return services.approve(request, actor=actor, reason=reason, cluster=cluster)
    except InsufficientCapacity as exc:
        # A request no unit would ever serve (the tier policy changed since it was submitted) is not queued.
        servable = exc.detail.get("servable", True)
        if request.wait_if_full and request.state == RequestState.SUBMITTED and servable:
            with transaction.atomic():
                entry = enqueue(request, actor=actor, reason=f"queued: {exc.message}")
                entry.operator_approved_at, entry.operator_approved_by = timezone.now(), services._user(actor)
                entry.save(update_fields=["operator_approved_at", "operator_approved_by"])
            return None
        raise


def fits_now(request: PoolRequest) -> bool:
    """Could approval take the request's units now (on one cluster, or across clusters where it may)?"""
    return queue_policy.fits(request, units.read_free(request))


# --- Operator actions ----------------------------------------------------------------------------


def _waiting_entry(request: PoolRequest) -> QueueEntry:
    entry = QueueEntry.objects.filter(request=request, request__state=RequestState.QUEUED).first()
    if entry is None:
        raise DomainError(f"Pool request #{request.pk} is not waiting in the queue.", detail={"state": request.state})
    return entry


def move(request: PoolRequest, *, position: int, actor, reason: str = "") -> int:
    """Put a queued request at `position` (1-based) and keep everyone else's relative order.

    The entries down to the new place get ranks 1..position, so the order a move sets survives later
    changes of fair share; the rest keep the computed order behind them. Returns the new position.
    """
    if position < 1:
        raise DomainError("A position starts at 1.", detail={"position": "must be at least 1"})
    with transaction.atomic():
        _lock_queue()
        entry = _waiting_entry(request)
        order = [p.entry for p in queue_policy.ordered()]
        before = next(i for i, e in enumerate(order, start=1) if e.pk == entry.pk)
        order = [e for e in order if e.pk != entry.pk]
        position = min(position, len(order) + 1)
        order.insert(position - 1, entry)
        for rank, e in enumerate(order[:position], start=1):
            QueueEntry.objects.filter(pk=e.pk).update(manual_rank=rank)
        QueueEntry.objects.filter(pk__in=[e.pk for e in order[position:]], manual_rank__isnull=False).update(
            manual_rank=None
        )
        _event(request, QueueAction.MOVED, actor=actor, detail=f"from {before} to {position}. {reason}".strip())
    return position


def hold(request: PoolRequest, *, actor, reason: str = "") -> QueueEntry:
    """Keep a queued request's place but skip it when capacity frees, until the hold is released."""
    with transaction.atomic():
        entry = _waiting_entry(request)
        if QueueEntry.objects.filter(pk=entry.pk, on_hold=False).update(on_hold=True, approvable_at=None) != 1:
            raise DomainError(f"Pool request #{request.pk} is already on hold.")
        _event(request, QueueAction.HELD, actor=actor, detail=reason)
    entry.on_hold = True
    return entry


def unhold(request: PoolRequest, *, actor, reason: str = "") -> QueueEntry:
    with transaction.atomic():
        entry = _waiting_entry(request)
        if QueueEntry.objects.filter(pk=entry.pk, on_hold=True).update(on_hold=False) != 1:
            raise DomainError(f"Pool request #{request.pk} is not on hold.")
        _event(request, QueueAction.UNHELD, actor=actor, detail=reason)
        services.enqueue_queue_processing()
    entry.on_hold = False
    return entry


def cancel(request: PoolRequest, *, actor, reason: str) -> PoolRequest:
    """An operator takes a request out of the queue: queued -> rejected, with the reason."""
    if not reason.strip():
        raise DomainError("Give a reason for the cancellation.", detail={"reason": "required"})
    with transaction.atomic():
        _waiting_entry(request)
        services.transition(request, RequestState.REJECTED, actor, f"cancelled from the queue: {reason}")
        _event(request, QueueAction.CANCELLED, actor=actor, detail=reason)
        services.enqueue_queue_processing()  # those it blocked may go now
    return request


def _lock_queue() -> list[int]:
    """Lock every queued request row, in primary-key order: queue passes and moves run one at a time."""
    return list(
        PoolRequest.objects.select_for_update()
        .filter(state=RequestState.QUEUED)
        .order_by("pk")
        .values_list("pk", flat=True)
    )


# --- Capacity freed --------------------------------------------------------------------------------


@dataclass
class Pass:
    approved: list[int]
    flagged: list[int]
    blocked: list[int]
    ended: list[int]


def process(*, now: dt.datetime | None = None) -> Pass:
    """Offer free units to the queue, in order; see the module docstring for the rules and the locking."""
    now = now or timezone.now()
    result = Pass([], [], [], [])
    with transaction.atomic():
        if not _lock_queue():
            return result
        book = queue_policy.approval_book()
        blocked: set[tuple] = set()
        busy = None  # running pods' devices (units.read_free): approvals in this pass do not change them
        for place in queue_policy.ordered(now=now):
            entry, request = place.entry, place.entry.request
            key = queue_policy.spec_key(request)
            if request.end_at is not None and request.end_at <= now:
                services.transition(
                    request, RequestState.REJECTED, None, f"ended at {request.end_at:%Y-%m-%d %H:%M} while waiting"
                )
                _event(request, QueueAction.CANCELLED, detail="its end came while it waited", at=now)
                result.ended.append(request.pk)
                continue
            if entry.on_hold or key in blocked:
                continue
            free = units.read_free(request, busy)
            busy = free.busy_devices if busy is None else busy
            if not queue_policy.fits(request, free):
                blocked.add(key)
                result.blocked.append(request.pk)
                if entry.approvable_at is not None:
                    QueueEntry.objects.filter(pk=entry.pk).update(approvable_at=None)
                continue
            policy = book.first_allowing(request, now)
            if policy is None and entry.operator_approved_at is None:
                blocked.add(key)  # the units are the head's until an operator decides
                if QueueEntry.objects.filter(pk=entry.pk, approvable_at__isnull=True).update(approvable_at=now):
                    _event(request, QueueAction.APPROVABLE, detail="capacity is free for it now", at=now)
                result.flagged.append(request.pk)
                continue
            if not _approve_from_queue(request, entry, result, now=now, policy=policy, free=free):
                blocked.add(key)  # taken meanwhile, or ended: leave it, block its spec this pass
    return result


def _approve_from_queue(
    request: PoolRequest, entry: QueueEntry, result: Pass, *, now: dt.datetime, policy, free: units.FreeUnits
) -> bool:
    """Approve a queued request that fits now: by `policy`, or else in the name of the operator who approved
    it while capacity was short (approve_or_queue). False when it cannot be done now (taken meanwhile, ended)."""
    if policy is not None:
        actor, action, detail = None, QueueAction.AUTO_APPROVED, ""
        reason = f"auto-approved from the queue by policy {policy.name}"
    else:
        actor, action = entry.operator_approved_by, QueueAction.APPROVED
        who = actor.get_username() if actor is not None else "an operator"
        reason = f"approved by {who} while queued; capacity freed"
        detail = f"{who} approved it at {entry.operator_approved_at:%Y-%m-%d %H:%M} while capacity was short"
    try:
        with transaction.atomic():
            services.approve(request, actor=actor, reason=reason, policy=policy, free=free)
            _event(request, action, actor=actor, policy=policy, detail=detail, at=now)
    except DomainError as exc:
        logger.info("queue: request %s not approved: %s", request.pk, exc.message)
        result.blocked.append(request.pk)
        return False
    result.approved.append(request.pk)
    return True


def refresh_forecast(entry: QueueEntry, *, first: bool = False, now: dt.datetime | None = None, history=None) -> None:
    """Store the request's current forecast on its entry (and as the first one, to be scored later).
    `history` (forecast.hold_history) saves reading it again for each entry of a beat."""
    estimate = forecast.estimate_start(entry.request, now=now, history=history)
    fields = {
        "forecast_p50": estimate.p50,
        "forecast_p90": estimate.p90,
        "forecast_basis": estimate.basis,
        "forecast_at": now or timezone.now(),
    }
    if first:
        fields.update(first_p50=estimate.p50, first_p90=estimate.p90)
    QueueEntry.objects.filter(pk=entry.pk).update(**fields)
    for name, value in fields.items():
        setattr(entry, name, value)


def refresh_forecasts(*, now: dt.datetime | None = None) -> int:
    """Beat: refresh every waiting entry's forecast. Returns how many."""
    places = queue_policy.ordered(now=now)
    history = forecast.hold_history(now=now) if places else None
    for place in places:
        refresh_forecast(place.entry, now=now, history=history)
    return len(places)

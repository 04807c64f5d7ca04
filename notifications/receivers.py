"""The receivers of the lower layers' signals: each turns one happening into one Event (services.record).

They run inside the sender's transaction and cost it one INSERT (ON CONFLICT DO NOTHING) and no reads:
the payload holds what the message needs from the signal's objects (fields already loaded), and the
subject, text and recipients are worked out after commit (services.fan_out). What they write rolls
back with the change. Each event's key names the row it is about, so a signal sent twice (a retried
service, a repeated sweep) records it once.
"""

from __future__ import annotations

from billing import signals as billing_signals
from monitoring import signals as monitoring_signals
from operations import signals as operations_signals
from pools import signals as pool_signals

from . import services
from .choices import EventKind

_REQUEST_EVENTS = {
    pool_signals.request_approved: EventKind.REQUEST_APPROVED,
    pool_signals.request_queued: EventKind.REQUEST_QUEUED,
    pool_signals.request_started_from_queue: EventKind.REQUEST_STARTED_FROM_QUEUE,
    pool_signals.request_refused: EventKind.REQUEST_REFUSED,
}


def _who(actor) -> str:
    return actor.get_username() if actor is not None else "gpuaas"


def _at(value) -> str:
    return f"{value:%Y-%m-%d %H:%M}" if value else ""


def on_request(signal, sender, request, actor=None, reason: str = "", at=None, **kwargs) -> None:
    kind = _REQUEST_EVENTS[signal]
    services.record(
        kind=kind,
        key=f"{kind}:{request.pk}",
        project_id=request.project_id,
        payload={
            "request": request.pk,
            "label": request.name or f"{request.spec_label} x {request.count}",
            "reason": reason,
            "actor": _who(actor),
            "at": _at(at),
        },
        occurred_at=at,
    )


def on_loan_reclaimed(sender, loan, reason: str = "", at=None, **kwargs) -> None:
    services.record(
        kind=EventKind.LOAN_RECLAIMED,
        key=f"{EventKind.LOAN_RECLAIMED}:{loan.pk}",
        project_id=loan.borrower_id,
        payload={"loan": loan.pk, "allocation": loan.allocation_id, "reason": reason},
        occurred_at=at,
    )


def on_allocation_ended(sender, allocation, cause: str, reason: str = "", at=None, **kwargs) -> None:
    services.record(
        kind=EventKind.ALLOCATION_ENDED,
        key=f"{EventKind.ALLOCATION_ENDED}:{allocation.pk}",
        project_id=allocation.project_id,
        payload={
            "allocation": allocation.pk,
            "pool": allocation.pool_id,
            "unit": f"{allocation.product} {allocation.profile_name or allocation.kind}".strip(),
            "cause": cause,
            "reason": reason,
        },
        occurred_at=at,
    )


def on_maintenance_notice(sender, drain, project_id: int, allocation_ids, evict_after, at=None, **kwargs) -> None:
    services.record(
        kind=EventKind.MAINTENANCE_NOTICE,
        key=f"{EventKind.MAINTENANCE_NOTICE}:{drain.pk}:{project_id}",
        project_id=project_id,
        payload={
            "drain": drain.pk,
            "node": drain.node.name,
            "reason": drain.reason,
            "allocations": list(allocation_ids),
            "evict_after": _at(evict_after),
        },
        occurred_at=at,
    )


def on_idle_flagged(sender, flag, **kwargs) -> None:
    allocation = flag.allocation
    proposal = flag.get_proposal_display().lower()
    if flag.suggested_profile:
        proposal += f" to {flag.suggested_profile}"
    services.record(
        kind=EventKind.IDLE_FLAGGED,
        key=f"{EventKind.IDLE_FLAGGED}:{flag.pk}",
        project_id=allocation.project_id,
        payload={
            "flag": flag.pk,
            "allocation": allocation.pk,
            "pool": allocation.pool_id,
            "sm_active_avg": flag.sm_active_avg,
            "window_start": _at(flag.window_start),
            "window_end": _at(flag.window_end),
            "proposal": proposal,
        },
        occurred_at=flag.detected_at,
    )


def on_trespass(sender, event, **kwargs) -> None:
    services.record(
        kind=EventKind.TRESPASS,
        key=f"{EventKind.TRESPASS}:{event.pk}",
        project_id=event.owner_project_id,
        payload={
            "trespass": event.pk,
            "what": event.get_kind_display(),
            "unit": event.unit_key,
            "namespace": event.namespace,
            "pod": event.pod_name,
            "started": _at(event.started_at),
        },
        occurred_at=event.started_at,
    )


def on_statement_finalised(sender, statement, actor=None, **kwargs) -> None:
    services.record(
        kind=EventKind.STATEMENT_FINALISED,
        key=f"{EventKind.STATEMENT_FINALISED}:{statement.pk}",
        project_id=statement.project_id,
        payload={
            "statement": statement.pk,
            "period": f"{statement.period:%Y-%m}",
            "total": str(statement.total_amount),
            "currency": statement.currency,
        },
        occurred_at=statement.finalised_at,
    )


def connect() -> None:
    """Connected once, at start-up (NotificationsConfig.ready); dispatch_uid keeps it idempotent."""
    for signal, kind in _REQUEST_EVENTS.items():
        signal.connect(on_request, dispatch_uid=f"notifications.{kind}")
    pool_signals.loan_reclaimed.connect(on_loan_reclaimed, dispatch_uid="notifications.loan_reclaimed")
    pool_signals.allocation_ended.connect(on_allocation_ended, dispatch_uid="notifications.allocation_ended")
    operations_signals.maintenance_notice.connect(on_maintenance_notice, dispatch_uid="notifications.maintenance")
    monitoring_signals.idle_reservation_flagged.connect(on_idle_flagged, dispatch_uid="notifications.idle")
    monitoring_signals.trespass_opened.connect(on_trespass, dispatch_uid="notifications.trespass")
    billing_signals.statement_finalised.connect(on_statement_finalised, dispatch_uid="notifications.statement")

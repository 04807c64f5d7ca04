"""The receivers of the lower layers' signals: each turns one happening into one Event (services.record).

They run inside the sender's transaction; what they write rolls back with it, and the deliveries are
enqueued only after commit. Each event's key names the row it is about, so a signal sent twice (a
retried service, a repeated sweep) records it once.
"""

from __future__ import annotations

from billing import signals as billing_signals
from monitoring import signals as monitoring_signals
from pools import signals as pool_signals
from pools.signals import AllocationEndCause

from . import services
from .choices import EventKind

_REQUEST_EVENTS = {
    pool_signals.request_approved: (EventKind.REQUEST_APPROVED, "approved"),
    pool_signals.request_queued: (EventKind.REQUEST_QUEUED, "queued: waiting for capacity"),
    pool_signals.request_started_from_queue: (EventKind.REQUEST_STARTED_FROM_QUEUE, "started from the queue"),
    pool_signals.request_refused: (EventKind.REQUEST_REFUSED, "refused"),
}


def _who(actor) -> str:
    return actor.get_username() if actor is not None else "gpuaas"


def on_request(signal, sender, request, actor=None, reason: str = "", at=None, **kwargs) -> None:
    kind, what = _REQUEST_EVENTS[signal]
    project = request.project
    label = request.name or f"{request.spec_label} x {request.count}"
    services.record(
        kind=kind,
        key=f"{kind}:{request.pk}",
        project=project,
        subject=f"{project.slug}: request #{request.pk} {what}",
        body=(
            f"Pool request #{request.pk} ({label}) of {project.name} was {what} by {_who(actor)}"
            f"{' at ' + f'{at:%Y-%m-%d %H:%M} UTC' if at else ''}."
            f"{' Reason: ' + reason if reason else ''}\n{services.project_link(project)}"
        ),
        payload={"request": request.pk, "state": request.state, "reason": reason, "actor": _who(actor)},
        occurred_at=at,
    )


def on_loan_reclaimed(sender, loan, reason: str = "", at=None, **kwargs) -> None:
    project = loan.borrower
    services.record(
        kind=EventKind.LOAN_RECLAIMED,
        key=f"{EventKind.LOAN_RECLAIMED}:{loan.pk}",
        project=project,
        subject=f"{project.slug}: a borrowed unit is being reclaimed (loan #{loan.pk})",
        body=(
            f"The lender needs the unit lent to {project.name} under loan #{loan.pk} back ({reason}). "
            f"Pods running on it are evicted when the grace period ends.\n{services.project_link(project)}"
        ),
        payload={"loan": loan.pk, "allocation": loan.allocation_id, "reason": reason},
        occurred_at=at,
    )


_CAUSES = {AllocationEndCause.MIG_CHANGE: "a MIG change", AllocationEndCause.MAINTENANCE: "maintenance"}


def on_allocation_ended(sender, allocation, cause: str, reason: str = "", at=None, **kwargs) -> None:
    project = allocation.project
    unit = f"{allocation.product} {allocation.profile_name or allocation.kind}".strip()
    services.record(
        kind=EventKind.ALLOCATION_ENDED,
        key=f"{EventKind.ALLOCATION_ENDED}:{allocation.pk}",
        project=project,
        subject=f"{project.slug}: allocation #{allocation.pk} ended by {_CAUSES.get(cause, cause)}",
        body=(
            f"Allocation #{allocation.pk} ({unit}) of pool #{allocation.pool_id} ended by {_CAUSES.get(cause, cause)}: "
            f"{reason}. Billing stopped then; the pool keeps its other units.\n{services.project_link(project)}"
        ),
        payload={"allocation": allocation.pk, "pool": allocation.pool_id, "cause": cause, "reason": reason},
        occurred_at=at,
    )


def on_idle_flagged(sender, flag, **kwargs) -> None:
    allocation = flag.allocation
    project = allocation.project
    proposal = flag.get_proposal_display().lower()
    if flag.suggested_profile:
        proposal += f" to {flag.suggested_profile}"
    services.record(
        kind=EventKind.IDLE_FLAGGED,
        key=f"{EventKind.IDLE_FLAGGED}:{flag.pk}",
        project=project,
        subject=f"{project.slug}: allocation #{allocation.pk} flagged idle",
        body=(
            f"Allocation #{allocation.pk} of pool #{allocation.pool_id} averaged {flag.sm_active_avg:.1f}% SM activity "
            f"from {flag.window_start:%Y-%m-%d %H:%M} to {flag.window_end:%Y-%m-%d %H:%M} UTC. "
            f"Proposal: {proposal}.\n{services.project_link(project)}"
        ),
        payload={"flag": flag.pk, "allocation": allocation.pk, "sm_active_avg": flag.sm_active_avg},
        occurred_at=flag.detected_at,
    )


def on_trespass(sender, event, **kwargs) -> None:
    project = event.owner_project
    who = f"pod {event.namespace}/{event.pod_name}" if event.pod_name else "an unknown process"
    services.record(
        kind=EventKind.TRESPASS,
        key=f"{EventKind.TRESPASS}:{event.pk}",
        project=project,
        subject=f"{project.slug}: {who} is using your unit {event.unit_key}",
        body=(
            f"{event.get_kind_display()}: {who} runs on {event.unit_key}, which {project.name} holds, "
            f"since {event.started_at:%Y-%m-%d %H:%M} UTC. Its project is charged for the time, not yours."
            f"\n{services.project_link(project)}"
        ),
        payload={"trespass": event.pk, "unit": event.unit_key, "namespace": event.namespace, "pod": event.pod_name},
        occurred_at=event.started_at,
    )


def on_statement_finalised(sender, statement, actor=None, **kwargs) -> None:
    project = statement.project
    services.record(
        kind=EventKind.STATEMENT_FINALISED,
        key=f"{EventKind.STATEMENT_FINALISED}:{statement.pk}",
        project=project,
        subject=f"{project.slug}: statement for {statement.period:%Y-%m} finalised",
        body=(
            f"The statement of {project.name} for {statement.period:%B %Y} was finalised: "
            f"{statement.total_amount} {statement.currency}.\n{services.project_link(project)}"
        ),
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
    for signal in _REQUEST_EVENTS:
        signal.connect(on_request, dispatch_uid=f"notifications.on_request.{id(signal)}")
    pool_signals.loan_reclaimed.connect(on_loan_reclaimed, dispatch_uid="notifications.loan_reclaimed")
    pool_signals.allocation_ended.connect(on_allocation_ended, dispatch_uid="notifications.allocation_ended")
    monitoring_signals.idle_reservation_flagged.connect(on_idle_flagged, dispatch_uid="notifications.idle")
    monitoring_signals.trespass_opened.connect(on_trespass, dispatch_uid="notifications.trespass")
    billing_signals.statement_finalised.connect(on_statement_finalised, dispatch_uid="notifications.statement")

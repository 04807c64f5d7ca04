"""Subject and text of each kind of event, written at fan-out from the payload the receiver captured and the
event's project (so the sender's transaction does no more than insert the event)."""

from __future__ import annotations

from django.conf import settings

from .choices import EventKind
from .models import Event

CAUSES = {"mig_change": "a MIG change", "maintenance": "maintenance"}


def link(path: str) -> str:
    return f"{settings.NOTIFY_BASE_URL}{path}"


def _request(event: Event, what: str) -> tuple[str, str]:
    p, project = event.payload, event.project
    reason = f" Reason: {p['reason']}" if p.get("reason") else ""
    return (
        f"{project.slug}: request #{p['request']} {what}",
        f"Pool request #{p['request']} ({p['label']}) of {project.name} was {what} by {p['actor']} "
        f"at {p['at']} UTC.{reason}",
    )


def _expiring(event: Event) -> tuple[str, str]:
    p = event.payload
    return (
        f"{event.project.slug}: pool of request #{p['request']} ends {p['end']} UTC",
        f"The pool of request #{p['request']} ({p['label']}) ends at {p['end']} UTC, in about {p['hours']} h; "
        "its units are released then.",
    )


def _idle(event: Event) -> tuple[str, str]:
    p = event.payload
    return (
        f"{event.project.slug}: allocation #{p['allocation']} flagged idle",
        f"Allocation #{p['allocation']} of pool #{p['pool']} averaged {p['sm_active_avg']:.1f}% SM activity from "
        f"{p['window_start']} to {p['window_end']} UTC. Proposal: {p['proposal']}.",
    )


def _loan(event: Event) -> tuple[str, str]:
    p = event.payload
    return (
        f"{event.project.slug}: a borrowed unit is being reclaimed (loan #{p['loan']})",
        f"The lender needs the unit lent to {event.project.name} under loan #{p['loan']} back ({p['reason']}). "
        "Pods running on it are evicted when the grace period ends.",
    )


def _ended(event: Event) -> tuple[str, str]:
    p = event.payload
    cause = CAUSES.get(p["cause"], p["cause"])
    return (
        f"{event.project.slug}: allocation #{p['allocation']} ended by {cause}",
        f"Allocation #{p['allocation']} ({p['unit']}) of pool #{p['pool']} ended by {cause}: {p['reason']}. "
        "Billing stopped then; the pool keeps its other units.",
    )


def _maintenance(event: Event) -> tuple[str, str]:
    p = event.payload
    why = f" ({p['reason']})" if p.get("reason") else ""
    ids = ", ".join(f"#{a}" for a in p["allocations"])
    return (
        f"{event.project.slug}: maintenance on {p['node']}: your reservations move",
        f"Node {p['node']} goes offline for maintenance{why}. {event.project.name}'s reservations there "
        f"({ids}) move to equivalent units elsewhere; billing goes on unchanged. Pods still running on "
        f"{p['node']} are evicted from {p['evict_after']} UTC and start again on the moved units.",
    )


def _statement(event: Event) -> tuple[str, str]:
    p = event.payload
    return (
        f"{event.project.slug}: statement for {p['period']} finalised",
        f"The statement of {event.project.name} for {p['period']} was finalised: {p['total']} {p['currency']}.",
    )


def _trespass(event: Event) -> tuple[str, str]:
    p = event.payload
    who = f"pod {p['namespace']}/{p['pod']}" if p.get("pod") else "an unknown process"
    return (
        f"{event.project.slug}: {who} is using your unit {p['unit']}",
        f"{p['what']}: {who} runs on {p['unit']}, which {event.project.name} holds, since {p['started']} UTC. "
        "Its project is charged for the time, not yours.",
    )


RENDER = {
    EventKind.REQUEST_APPROVED: lambda e: _request(e, "approved"),
    EventKind.REQUEST_QUEUED: lambda e: _request(e, "queued: waiting for capacity"),
    EventKind.REQUEST_STARTED_FROM_QUEUE: lambda e: _request(e, "started from the queue"),
    EventKind.REQUEST_REFUSED: lambda e: _request(e, "refused"),
    EventKind.POOL_EXPIRING: _expiring,
    EventKind.IDLE_FLAGGED: _idle,
    EventKind.LOAN_RECLAIMED: _loan,
    EventKind.ALLOCATION_ENDED: _ended,
    EventKind.MAINTENANCE_NOTICE: _maintenance,
    EventKind.STATEMENT_FINALISED: _statement,
    EventKind.TRESPASS: _trespass,
}


def render(event: Event) -> tuple[str, str]:
    """(subject, text) of `event`; an event recorded with its own (the digest) keeps them."""
    if event.subject:
        return event.subject, event.body
    subject, body = RENDER[event.kind](event)
    return subject[:200], f"{body}\n{link(f'/projects/{event.project.slug}/')}"

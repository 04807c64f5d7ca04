"""How a reconfiguration records itself: the audit trail, the stamped conditional UPDATE, the next message.

Every module of the state machine (and the drains' lifecycle) writes through these, so the trail
(MigReconfigurationStep rows) and updated_at (which sweep() reads) are kept the same way everywhere.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from capacity.choices import ReconfigurationEvent as Event
from capacity.choices import ReconfigurationState as State
from capacity.models import MigReconfiguration, MigReconfigurationStep

from .outcomes import IllegalTransition


def audit(reconf, step: str, event: str, message: str = "", *, detail=None, task_id: str = "", actor=None):
    """One MigReconfigurationStep row (`reconf`: the row or its id); the admin and the API show these."""
    return trail_row(MigReconfigurationStep, "reconfiguration", reconf, step, event, message, detail, task_id, actor)


def trail_row(model, owner: str, row, step: str, event: str, message: str, detail, task_id: str, actor):
    """One row of a workflow's trail (`model`, whose foreign key `owner` points at `row`, the row or its id)."""
    return model.objects.create(
        **{f"{owner}_id": row.pk if hasattr(row, "pk") else row},
        step=step,
        event=event,
        message=message[:4000],
        detail=detail or {},
        task_id=(task_id or "")[:64],
        actor=actor,
    )


def enqueue(reconf: MigReconfiguration, step: str, *, countdown: int | None = None) -> None:
    """Send the step's task after commit (operations.tasks.enqueue_reconfiguration_step)."""
    from operations.tasks import enqueue_reconfiguration_step  # cycle: operations.tasks imports this package

    pk = reconf.pk
    transaction.on_commit(lambda: enqueue_reconfiguration_step(pk, step, countdown=countdown))


def stamp(**fields) -> dict:
    """UPDATE ... SET fields plus updated_at (QuerySet.update() skips auto_now; sweep() reads it).

    Giving up the claim (claim_token="") ends its lease too."""
    fields["updated_at"] = timezone.now()
    if fields.get("claim_token") == "":
        fields["lease_expires_at"] = None
    return fields


def user_or_none(actor):
    """The acting user to record, or None for the system (an AnonymousUser or a missing actor)."""
    return actor if getattr(actor, "pk", None) else None


def resume_failed(row, *, label: str, audit, enqueue, actor=None, **updates):
    """Re-run the failed step of a workflow row (a reconfiguration or a drain; IllegalTransition unless
    failed): the step re-opened (core.leases.LeasedStep.resumed, plus `updates`), audited, its message sent."""
    model = type(row)
    with transaction.atomic():
        if model.objects.filter(pk=row.pk, state=State.FAILED).update(**stamp(**model.resumed(**updates))) != 1:
            row.refresh_from_db()
            raise IllegalTransition(f"{label} #{row.pk} is {row.state}, not failed")
        row.refresh_from_db()
        audit(row, row.step, Event.RESUMED, f"resumed at {row.step}", actor=user_or_none(actor))
        enqueue(row, row.step)
    return row

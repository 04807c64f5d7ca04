"""How a drain records itself: its audit trail (NodeDrainStep rows) and its next message.

The conditional UPDATE's stamp is the reconfiguration's (operations.reconfiguration.records.stamp).
"""

from __future__ import annotations

from django.db import transaction

from capacity.models import NodeDrain, NodeDrainStep
from operations.reconfiguration.records import trail_row


def audit(drain, step: str, event: str, message: str = "", *, detail=None, task_id: str = "", actor=None):
    """One NodeDrainStep row (`drain`: the row or its id); the admin and the API show these."""
    return trail_row(NodeDrainStep, "drain", drain, step, event, message, detail, task_id, actor)


def enqueue(drain: NodeDrain, step: str, *, countdown: int | None = None) -> None:
    """Send the step's task after commit (operations.tasks.enqueue_drain_step)."""
    from operations.tasks import enqueue_drain_step  # cycle: operations.tasks imports this package

    pk = drain.pk
    transaction.on_commit(lambda: enqueue_drain_step(pk, step, countdown=countdown))

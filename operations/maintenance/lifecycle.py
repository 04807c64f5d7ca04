"""Starting and steering drains: start, give back, resume (the operator's verbs).

Each claims its change with a conditional UPDATE and enqueues the next step after commit; a change the
current state does not allow raises IllegalTransition (API: 409).
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from capacity.choices import DrainStep as Step
from capacity.choices import ReconfigurationEvent as Event
from capacity.choices import ReconfigurationState as State
from capacity.models import MigReconfiguration, NodeCapacity, NodeDrain
from operations.reconfiguration.outcomes import IllegalTransition, Refused
from operations.reconfiguration.records import resume_failed, user_or_none
from policies import policy

from .check import take_offline_check
from .records import audit, enqueue
from .steps import shortfall_sentence


def start(
    node: NodeCapacity, *, reason: str = "", grace_s: int | None = None, driver_upgrade: bool = False, actor=None
) -> NodeDrain:
    """Start draining `node`: create the NodeDrain and enqueue its check after commit.

    Refused (nothing written, nothing enqueued, the shortfall in the message and `detail`) when the free
    reserve cannot absorb the node's reservations; IllegalTransition when the node already has an open
    drain or MIG reconfiguration (the unique constraint on open drains settles races between two starters).
    `driver_upgrade`: hand the node to the GPU Operator's upgrade controller at handover (upgrades.hand_over).
    """
    if node.is_gone:
        raise IllegalTransition(f"{node} is gone (discovery no longer sees it)")
    check = take_offline_check(nodes=[node])
    if not check.covered:
        raise Refused(
            f"the free reserve cannot absorb {node}'s reservations: short of {shortfall_sentence(check.shortfall)}",
            {"shortfall": check.shortfall, "hit": [h.to_dict() for h in check.hit]},
        )
    grace = policy("MAINTENANCE_GRACE_S") if grace_s is None else grace_s
    try:
        with transaction.atomic():
            if NodeDrain.objects.open().filter(node=node).exists():
                raise IllegalTransition(f"{node} already has an open drain")
            if MigReconfiguration.objects.open().filter(node=node).exists():
                raise IllegalTransition(f"{node} has an open MIG reconfiguration")
            drain = NodeDrain.objects.create(
                cluster_id=node.cluster_id,
                node=node,
                reason=reason,
                created_by=user_or_none(actor),
                grace_s=grace,
                driver_upgrade=driver_upgrade,
            )
            audit(
                drain,
                Step.CHECK,
                Event.CREATED,
                f"drain of {node}: {len(check.hit)} reservation(s) to move" + (f" ({reason})" if reason else ""),
                detail={"hit": [h.to_dict() for h in check.hit]},
                actor=drain.created_by,
            )
            enqueue(drain, Step.CHECK)
    except IntegrityError:
        raise IllegalTransition(f"{node} already has an open drain") from None
    return drain


def give_back(drain: NodeDrain, *, actor=None, note: str = "") -> NodeDrain:
    """The operator (or the upgrade) is done with the node: uncordon it once it reports healthy.
    Only a drain handed over (at handover, not failed) and not given back already."""
    now = timezone.now()
    with transaction.atomic():
        claimed = NodeDrain.objects.filter(
            pk=drain.pk,
            step=Step.HANDOVER,
            state__in=[State.PENDING, State.WAITING, State.RUNNING],
            give_back_at__isnull=True,
        ).update(give_back_at=now)
        drain.refresh_from_db()
        if claimed != 1:
            raise IllegalTransition(f"drain #{drain.pk} is {drain.phase}: only a node handed over can be given back")
        audit(drain, Step.HANDOVER, Event.INFO, note or "given back", actor=user_or_none(actor))
        enqueue(drain, Step.HANDOVER)
    return drain


def resume(drain: NodeDrain, *, actor=None) -> NodeDrain:
    """Re-run the failed step (IllegalTransition unless failed)."""
    return resume_failed(drain, label="drain", audit=audit, enqueue=enqueue, actor=actor, state=State.PENDING)

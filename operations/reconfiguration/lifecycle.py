"""Starting and closing reconfigurations: create, resume, roll back, cancel (the operator's verbs).

Each claims its state change with a conditional UPDATE and enqueues the next step after commit; a
change the current state does not allow raises IllegalTransition (API: 409).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from capacity.choices import ReconfigurationBackend as Backend
from capacity.choices import ReconfigurationEvent as Event
from capacity.choices import ReconfigurationState as State
from capacity.choices import ReconfigurationStep as Step
from capacity.models import MigLayout, MigReconfiguration, NodeCapacity

from .outcomes import IllegalTransition, Refused
from .plan import assess
from .records import audit, enqueue, resume_failed, stamp, user_or_none


def create(
    node: NodeCapacity,
    target: dict,
    *,
    source: str = "custom",
    layout: MigLayout | None = None,
    backend: str = Backend.OPERATOR,
    drain: bool = False,
    force: bool = False,
    actor=None,
    now: datetime | None = None,
) -> MigReconfiguration:
    """Create a reconfiguration and enqueue its first step after commit.

    Refused (nothing written, nothing enqueued) when the check would refuse it now, the plan is
    invalid (ReconfigurationError) or the node already has an open one (IllegalTransition). The
    unique constraint on open reconfigurations per node settles races between two creators.
    """
    if backend not in Backend.values:
        raise ValueError(f"backend must be one of {', '.join(Backend.values)}")
    impact = assess(node, target, backend=backend, drain=drain, force=force, now=now)
    if impact.refusals:
        raise Refused("; ".join(impact.refusals))
    try:
        with transaction.atomic():
            if MigReconfiguration.objects.open().filter(node=node).exists():
                raise IllegalTransition(f"{node} already has an open MIG reconfiguration")
            reconf = MigReconfiguration.objects.create(
                cluster_id=node.cluster_id,
                node=node,
                layout=layout,
                source=source,
                target=target,
                backend=backend,
                drain=drain,
                force=force,
                created_by=user_or_none(actor),
            )
            audit(
                reconf,
                Step.PLAN,
                Event.CREATED,
                f"{source} on {node} via {backend}" + (" with drain" if drain else "") + (" (forced)" if force else ""),
                detail={"target": target, "changed": impact.changed},
                actor=reconf.created_by,
            )
            enqueue(reconf, Step.PLAN)
    except IntegrityError:
        raise IllegalTransition(f"{node} already has an open MIG reconfiguration") from None
    return reconf


def create_from(data: Mapping[str, Any], *, actor=None) -> MigReconfiguration:
    """create() from a validated request, the admin's form or the API's serializer: node, target,
    source, backend, drain, force and an optional layout, by name."""
    return create(
        data["node"],
        data["target"],
        source=data["source"],
        layout=data.get("layout"),
        backend=data["backend"],
        drain=data["drain"],
        force=data["force"],
        actor=actor,
    )


def resume(reconf: MigReconfiguration, *, actor=None) -> MigReconfiguration:
    """Re-run the failed step (IllegalTransition unless failed). A re-run of the step that sets
    nvidia.com/mig.config (apply on the operator path, verify on the agent path) uses a fresh config
    name, because the MIG manager only reacts to a changed label."""
    reconf.refresh_from_db()
    updates = {"state": State.PENDING}
    if reconf.step == (Step.APPLY if reconf.backend == Backend.OPERATOR else Step.VERIFY):
        updates["config_name"] = ""
        updates["config_written_at"] = None
    return resume_failed(reconf, label="reconfiguration", audit=audit, enqueue=enqueue, actor=actor, **updates)


def rollback(reconf: MigReconfiguration, *, actor=None) -> MigReconfiguration:
    """Close a failed reconfiguration and start a new one back to the layout recorded before it.

    The new one is forced (it repairs a node already taken out), drains like the original and inherits
    whether the node was cordoned before, so it uncordons only what gpuaas cordoned.
    """
    reconf.refresh_from_db()
    if not reconf.previous:
        raise IllegalTransition(f"reconfiguration #{reconf.pk} recorded no previous layout (it failed in plan)")
    target = {
        key: (
            None
            if not before["mig"]
            else [{"profile": p["profile"], "start": p["start"]} for p in before["placements"]]
        )
        for key, before in reconf.previous.get("gpus", {}).items()
    }
    with transaction.atomic():
        now = timezone.now()
        if (
            MigReconfiguration.objects.filter(pk=reconf.pk, state=State.FAILED).update(
                **stamp(state=State.ROLLED_BACK, finished_at=now, claim_token="")
            )
            != 1
        ):
            raise IllegalTransition(f"reconfiguration #{reconf.pk} is {reconf.state}, not failed")
        back = MigReconfiguration.objects.create(
            cluster_id=reconf.cluster_id,
            node_id=reconf.node_id,
            source=f"rollback of #{reconf.pk}",
            target=target,
            backend=reconf.backend,
            drain=reconf.drain,
            force=True,
            was_cordoned=reconf.was_cordoned,
            rollback_of=reconf,
            created_by=user_or_none(actor),
        )
        audit(reconf, reconf.step, Event.ROLLBACK, f"rolled back by #{back.pk}", actor=user_or_none(actor))
        audit(
            back,
            Step.PLAN,
            Event.CREATED,
            f"roll-back of #{reconf.pk}",
            detail={"target": target},
            actor=user_or_none(actor),
        )
        enqueue(back, Step.PLAN)
    reconf.refresh_from_db()
    return back


def cancel(reconf: MigReconfiguration, *, actor=None) -> MigReconfiguration:
    """Drop a reconfiguration that has not touched the node (pending in plan/check, or failed before
    cordon). Once the node is cordoned only resume or roll-back remain."""
    reconf.refresh_from_db()
    with transaction.atomic():
        updated = (
            MigReconfiguration.objects.filter(pk=reconf.pk, cordoned_at__isnull=True, was_cordoned__isnull=True)
            .filter(Q(state=State.FAILED) | Q(state=State.PENDING, step__in=[Step.PLAN, Step.CHECK]))
            .update(**stamp(state=State.CANCELLED, finished_at=timezone.now(), claim_token=""))
        )
        if updated != 1:
            raise IllegalTransition(f"reconfiguration #{reconf.pk} cannot be cancelled at {reconf.step}/{reconf.state}")
        audit(reconf, reconf.step, Event.CANCELLED, "cancelled", actor=user_or_none(actor))
    reconf.refresh_from_db()
    return reconf

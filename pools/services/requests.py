"""A request's states and their one gate, transition(): create, submit, withdraw, reject and release.

Every state change goes through `transition()`: one table of legal moves, a conditional UPDATE that
must touch exactly one row (`filter(pk=..., state=OLD).update(state=NEW) == 1`), and one
PoolRequestTransition row saying who, when and why. An illegal move raises IllegalTransition (409).
Kubernetes work (provisioning, clean-up after release) is enqueued after commit (enqueue_*).
"""

from __future__ import annotations

import datetime as dt

from django.db import transaction
from django.utils import timezone

from capacity.models import GpuCapacity, NodeCapacity
from core.leases import lease_until
from tenancy import roles
from tenancy.models import Project

from .. import ending, services, signals, units
from ..choices import PoolState, RequestState
from ..exceptions import DomainError, IllegalTransition
from ..models import Allocation, GpuPool, PoolRequest, PoolRequestTransition
from ..units import specs

S = RequestState
TRANSITIONS: dict[str, frozenset[str]] = {
    S.DRAFT: frozenset({S.SUBMITTED, S.WITHDRAWN}),
    S.SUBMITTED: frozenset({S.APPROVED, S.REJECTED, S.WITHDRAWN, S.QUEUED}),
    S.QUEUED: frozenset({S.APPROVED, S.REJECTED, S.WITHDRAWN}),  # scheduling/queue.py
    S.APPROVED: frozenset({S.PROVISIONING}),
    S.PROVISIONING: frozenset({S.ACTIVE, S.FAILED, S.RELEASED, S.EXPIRED}),
    S.ACTIVE: frozenset({S.RELEASED, S.EXPIRED}),
    S.FAILED: frozenset({S.PROVISIONING, S.RELEASED, S.EXPIRED}),
    S.REJECTED: frozenset(),
    S.WITHDRAWN: frozenset(),
    S.RELEASED: frozenset(),
    S.EXPIRED: frozenset(),
}
# A queued request that leaves the queue ends the loans it ran on (pools/lending.py), saying why.
LOANS_END_ON_LEAVING_QUEUE: dict[str, str] = {
    S.APPROVED: "its own units were approved",
    S.REJECTED: "its request left the queue (rejected)",
    S.WITHDRAWN: "its request was withdrawn",
}


def is_legal(from_state: str, to_state: str) -> bool:
    return to_state in TRANSITIONS.get(from_state, frozenset())


def transition(request: PoolRequest, to_state: str, actor=None, reason: str = "", **fields) -> PoolRequest:
    """Move `request` to `to_state`, recording who and why; extra `fields` are set in the same UPDATE.

    Claims the move with a conditional UPDATE on the state it read, so two concurrent moves of one
    request cannot both succeed. If the claim misses because the object was stale, the state is read
    again and the move is tried from there when the table allows it (a release still releases a
    request that became active meanwhile); otherwise IllegalTransition names the state it lost to.
    A queued request leaving the queue ends the loans it ran on, in the same transaction
    (LOANS_END_ON_LEAVING_QUEUE, pools.lending.end_request_loans; the borrower's grant is reconciled
    after commit). Updates `request` in place and returns it.
    """
    now = timezone.now()
    actor = _user(actor)
    from_state = request.state
    with transaction.atomic():
        for _ in range(len(TRANSITIONS)):  # each miss means the state moved on: bounded by the states
            if not is_legal(from_state, to_state):
                raise IllegalTransition(request.pk, from_state, to_state)
            claimed = PoolRequest.objects.filter(pk=request.pk, state=from_state).update(
                state=to_state, state_reason=reason, updated_at=now, **fields
            )
            if claimed == 1:
                break
            from_state = PoolRequest.objects.filter(pk=request.pk).values_list("state", flat=True).first() or "gone"
        else:
            raise IllegalTransition(request.pk, from_state, to_state)
        PoolRequestTransition.objects.create(
            request=request, from_state=from_state, to_state=to_state, actor=actor, reason=reason, at=now
        )
        _announce(request, from_state, to_state, actor=actor, reason=reason, at=now)
        if from_state == S.QUEUED and to_state in LOANS_END_ON_LEAVING_QUEUE:
            from pools import lending  # cycle: lending imports provisioning, which imports this module

            # At the approval's own instant, when it sets one: billing of its own units starts there.
            at = fields.get("approved_at") or now
            lending.end_request_loans(request, reason=LOANS_END_ON_LEAVING_QUEUE[to_state], at=at)
    request.state, request.state_reason, request.updated_at = to_state, reason, now
    for name, value in fields.items():
        setattr(request, name, value)
    return request


def _announce(request: PoolRequest, from_state: str, to_state: str, *, actor, reason: str, at: dt.datetime) -> None:
    """Send the pools.signals signal of this move, if it is one people are told about (in the caller's transaction)."""
    if to_state == S.APPROVED:
        signal = signals.request_started_from_queue if from_state == S.QUEUED else signals.request_approved
    elif to_state == S.QUEUED:
        signal = signals.request_queued
    elif to_state == S.REJECTED:
        signal = signals.request_refused
    else:
        return
    signal.send(sender=PoolRequest, request=request, actor=actor, reason=reason, at=at)


# --- Creating and submitting ---------------------------------------------------------------------


def inventory_products() -> set[str]:
    """Every product name present in the fleet: catalog keys, NVML names and GFD names."""
    present = GpuCapacity.objects.present()
    names = set(present.exclude(catalog_product="").values_list("catalog_product", flat=True).distinct())
    names |= set(present.values_list("product", flat=True).distinct())
    names |= set(NodeCapacity.objects.present().exclude(gpu_product="").values_list("gpu_product", flat=True))
    return names


def fleet_mig_products() -> list[str]:
    rows = GpuCapacity.objects.present().filter(mig_mode_current=True).exclude(catalog_product="")
    return sorted(set(rows.values_list("catalog_product", flat=True).distinct()))


def resolve_spec(**declared) -> specs.Spec:
    """specs.resolve with the fleet's products filled in (two small queries)."""
    return specs.resolve(inventory_products=inventory_products(), fleet_mig_products=fleet_mig_products(), **declared)


def create_request(project: Project, *, actor, submit: bool = False, **values) -> PoolRequest:
    """Create a draft request (and submit it at once when `submit`), recording the creation.

    `values` are PoolRequest fields already resolved to a spec (see resolve_spec).
    """
    with transaction.atomic():
        request = PoolRequest.objects.create(project=project, requested_by=_user(actor), **values)
        if submit:
            transition(request, S.SUBMITTED, actor, "submitted")
    return request


def submit(request: PoolRequest, *, actor, reason: str = "") -> PoolRequest:
    """draft -> submitted; refused (DomainError, nothing changed) when no unit of the fleet would ever serve
    the request under the tier profile policy (units.refusal: the rule and the nearest offer that would)."""
    never = units.refusal(request)
    if never:
        raise DomainError(f"It can never be served: {never}.", detail={"profile_name": never})
    return transition(request, S.SUBMITTED, actor, reason or "submitted")


def withdraw(request: PoolRequest, *, actor, reason: str = "") -> PoolRequest:
    return transition(request, S.WITHDRAWN, actor, reason or "withdrawn")


def reject(request: PoolRequest, *, actor, reason: str) -> PoolRequest:
    if not reason.strip():
        raise DomainError("Give a reason for the rejection.", detail={"reason": "required"})
    return transition(request, S.REJECTED, actor, reason)


# --- Approval ------------------------------------------------------------------------------------


def _user(actor):
    return actor if actor is not None and getattr(actor, "is_authenticated", False) else None


def enqueue_provisioning(pool: GpuPool) -> None:
    """Enqueue provisioning on commit, with a lease: if no worker claims the pool before the lease
    runs out (message lost, worker dead), sweep_provisioning() enqueues it again."""
    from ..tasks import provision_pool_task  # cycle: pools.tasks imports this module

    GpuPool.objects.filter(pk=pool.pk, state=PoolState.PROVISIONING).update(
        claimed_by="", lease_expires_at=lease_until()
    )
    provision_pool_task.delay_on_commit(pool.pk)


def enqueue_queue_processing() -> None:
    """Units came free: offer them to the queue's head after commit (pools.signals.queue_pass_wanted, which
    scheduling answers with scheduling.queue.process())."""
    signals.queue_pass_wanted.send(sender=PoolRequest)


def enqueue_deprovisioning(pool: GpuPool) -> None:
    from ..tasks import deprovision_pool_task  # cycle: pools.tasks imports this module

    deprovision_pool_task.delay_on_commit(pool.pk)


def release(request: PoolRequest, *, actor, reason: str = "", to_state: str = S.RELEASED) -> PoolRequest:
    """Release (or expire) a request: its units are freed now, Kubernetes is cleaned up after commit.

    One transaction: claim the request's move, mark its pool released and set released_at on every
    active allocation (billing stops here), then enqueue the clean-up (quota removed or reduced,
    node labels removed) on commit. Idempotent through the claim: a second call raises IllegalTransition.
    """
    with transaction.atomic():
        now = timezone.now()
        transition(request, to_state, actor, reason or to_state)
        pool = GpuPool.objects.filter(request=request).first()
        if pool is not None:
            GpuPool.objects.filter(pk=pool.pk).update(state=PoolState.RELEASED, released_at=now, state_reason=reason)
            ended = list(Allocation.objects.active().filter(pool=pool).values_list("pk", flat=True))
            Allocation.objects.filter(pk__in=ended, released_at__isnull=True).update(released_at=now)
            # The units are "ending" until their pods are gone (pools/ending.py); the project is told now.
            ending.announce_ending(ended, reason=reason or f"the request was {to_state}", at=now)
            services.enqueue_deprovisioning(pool)
            services.enqueue_queue_processing()
    return request


def may_request_capacity(user, project: Project) -> bool:
    """Whether `user`'s role on `project` (one they can see) lets them request capacity there."""
    return roles.has_project_perm(user, project, "request_capacity")

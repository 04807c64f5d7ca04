"""MIG reconfiguration: a per-node state machine stored in MigReconfiguration, one Celery task per step.

    plan -> check -> cordon -> drain -> apply -> verify -> uncordon -> done

- plan: per-GPU placements of the target (capacity.mig.layout.validate_layout, reusing existing
  instances), the layout before (for roll-back); GPUs already in the target are left alone, and a
  node with nothing to change jumps to uncordon.
- check: refuses while an affected GPU carries an active pools.Allocation unless `drain`, and
  outside every maintenance window unless `force`; the node must still exist.
- cordon: spec.unschedulable (remembering whether it was cordoned before, so we only undo our own).
- drain: evicts (drain) or waits for the GPU pods of the affected GPUs, re-checking with a countdown
  until MIG_DRAIN_TIMEOUT_S.
- apply, two backends:
  * operator: gpuaas's mig-parted ConfigMap gets the config, the node label nvidia.com/mig.config is
    set to it, then nvidia.com/mig.config.state is polled (pending -> success | failed);
  * agent: on the node's queue (node_queue(cluster, node)) NVML destroys and creates GPU and compute
    instances at the planned placements (capacity.adapters.nvml.apply_gpu_layout).
- verify (on the node's queue, where its NVML is): on the operator path the state label says
  success for our config; rediscovery of the node (inventory) shows the planned instances: exact
  placements on the agent path, the same profiles on the operator path, whose placements mig-parted
  chooses (the observed ones are recorded). MIG allocations whose instance was recreated at the same
  placement are pointed at the new instance.
- uncordon: only if gpuaas cordoned it.

Claiming: a step runs only after `UPDATE ... SET state='running', claim_token=<task id> WHERE
step=<step> AND (state IN ('pending','waiting') OR (state='running' AND claim_token=<task id>))`
touched one row. A redelivered task (same id, after a worker died: acks_late) re-claims its own step
and carries on; every step is re-entrant (apply looks at what is already there, cordon and label
writes are idempotent). The claim carries a lease (lease_expires_at, WORKFLOW_LEASE_S) that a
heartbeat thread renews while the step runs (gpuaas.leases.Heartbeat); a running step whose lease
ran out belongs to a dead worker, and sweep() (beat, every MIG_RECONFIG_SWEEP_S) puts it back to
pending and re-sends it, without waiting for the broker's redelivery. Waiting steps never sleep:
they return Wait and are re-enqueued with a countdown (MIG_RECONFIG_POLL_S, far below the broker's
visibility timeout) until their deadline.

Failure: any error stops the reconfiguration in state failed at that step, with the error stored
and the node left as it is (cordoned once cordon ran). resume() re-runs the failed step; rollback()
closes it and starts a new reconfiguration back to the layout recorded before. Every step event is a
MigReconfigurationStep row (the audit trail).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from capacity.adapters import kubernetes as kube
from capacity.choices import ReconfigurationBackend as Backend
from capacity.choices import ReconfigurationEvent as Event
from capacity.choices import ReconfigurationState as State
from capacity.choices import ReconfigurationStep as Step
from capacity.mig.catalog import Product, find_product
from capacity.mig.layout import validate_layout
from capacity.models import (
    GPUAAS_CONFIG_PREFIX,
    GpuCapacity,
    MaintenanceWindow,
    MigInstance,
    MigLayout,
    MigReconfiguration,
    MigReconfigurationStep,
    NodeCapacity,
    WorkloadProfile,
)
from gpuaas.leases import Heartbeat, crash_point, lease_s, lease_until

from . import mig_configs

logger = logging.getLogger(__name__)

ORDER = [Step.PLAN, Step.CHECK, Step.CORDON, Step.DRAIN, Step.APPLY, Step.VERIFY, Step.UNCORDON, Step.DONE]
RESOURCE_PREFIX = "nvidia.com/"


def _setting(name: str, default: int) -> int:
    return int(getattr(settings, name, default))


def poll_interval_s() -> int:
    """Countdown of a waiting step's next check; keep it far below the Redis visibility timeout."""
    return _setting("MIG_RECONFIG_POLL_S", 5)


def step_timeout_s(step: str) -> int | None:
    return {
        Step.DRAIN: _setting("MIG_DRAIN_TIMEOUT_S", 900),
        Step.APPLY: _setting("MIG_APPLY_TIMEOUT_S", 1200),
        Step.VERIFY: _setting("MIG_VERIFY_TIMEOUT_S", 300),
    }.get(step)


def idle_s() -> int:
    """A pending or waiting step nobody touched for this long lost its message: sweep() re-sends it."""
    return lease_s() + poll_interval_s()


# --- Errors and step results -----------------------------------------------------------------


class ReconfigurationError(Exception):
    """A step failed; the reconfiguration stops in state failed with this message."""

    def __init__(self, message: str, detail: dict | None = None):
        super().__init__(message)
        self.detail = detail or {}


class Refused(ReconfigurationError):
    """The check refused: allocated GPUs without drain, or outside a maintenance window without force."""


class IllegalTransition(Exception):
    """The operation does not apply in the current state (API: 409)."""


@dataclass
class Advance:
    """A step finished: store `updates`, go to the next step (or `jump` to a later one)."""

    message: str
    detail: dict = field(default_factory=dict)
    updates: dict = field(default_factory=dict)
    jump: str | None = None


@dataclass
class Wait:
    """A step must check again later (re-enqueued with a countdown until the step's deadline)."""

    message: str
    detail: dict = field(default_factory=dict)


# --- Targets and plans -------------------------------------------------------------------------


def node_product(node: NodeCapacity) -> Product | None:
    """The MIG catalog product of a node's GPUs (from GpuCapacity rows, else the GFD label)."""
    gpu = node.gpus.filter(lost_at__isnull=True).exclude(catalog_product="").order_by("index").first()
    if gpu is not None:
        return find_product(gpu.catalog_product)
    return find_product(node.gpu_product) if node.gpu_product else None


def gpu_indices(node: NodeCapacity) -> list[int]:
    return list(
        GpuCapacity.objects.filter(node=node, lost_at__isnull=True).order_by("index").values_list("index", flat=True)
    )


def target_from(
    node: NodeCapacity,
    *,
    layout: MigLayout | None = None,
    named: str = "",
    per_gpu: dict | None = None,
) -> tuple[str, dict]:
    """(source, target) for a node: a MigLayout, a GPU Operator named config, or explicit per-GPU lists.

    Target: {"<index>": [profile names] | [{"profile", "start"}] | None (MIG off)}. Raises ValueError.
    """
    indices = gpu_indices(node)
    if not indices:
        raise ValueError(f"{node} has no GPUs known to gpuaas yet (run discovery first)")
    product = node_product(node)
    if sum(x is not None and x != "" and x != {} for x in (layout, named, per_gpu)) != 1:
        raise ValueError("give exactly one of a layout, a named config or per-GPU profiles")
    if layout is not None:
        if product is None or product.key != layout.product:
            raise ValueError(f"layout {layout.name} is for {layout.product}, {node} has {product and product.key}")
        targets = layout.targets_for(indices)
        if not targets:
            raise ValueError(f"layout {layout.name} names no GPU that {node} has")
        return layout.config_name, {str(i): v for i, v in targets.items()}
    if named:
        if product is None:
            raise ValueError(f"{node} has no MIG-capable GPUs")
        try:
            targets = mig_configs.named_config_targets(named, product, indices)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
        return named, {str(i): v for i, v in targets.items()}
    target = {}
    for key, value in per_gpu.items():
        if int(key) not in indices:
            raise ValueError(f"{node} has no GPU {key}")
        target[str(int(key))] = value
    return "custom", target


@dataclass
class GpuPlan:
    index: int
    product: str
    before_mig: bool
    before: list[dict]
    after_mig: bool
    after: list[dict]

    @property
    def changed(self) -> bool:
        return self.before_mig != self.after_mig or _placement_set(self.before) != _placement_set(self.after)

    def to_dict(self) -> dict:
        return {
            "mig": self.after_mig,
            "placements": self.after,
            "before_mig": self.before_mig,
            "before": self.before,
            "changed": self.changed,
        }


def _placement_set(placements: list[dict]) -> set[tuple[str, int]]:
    return {(p["profile"], int(p["start"])) for p in placements}


def _profile_counts(placements: list[dict]) -> Counter:
    return Counter(p["profile"] for p in placements)


def current_layouts(node: NodeCapacity) -> dict[int, tuple[GpuCapacity, list[dict], set[int]]]:
    """index -> (GPU, its active instances as placements, starts of instances with active allocations)."""
    from pools.models import Allocation

    gpus = {g.index: g for g in GpuCapacity.objects.filter(node=node, lost_at__isnull=True).order_by("index")}
    placements: dict[int, list[dict]] = {i: [] for i in gpus}
    instances = (
        MigInstance.objects.active()
        .filter(gpu__in=list(gpus.values()))
        .select_related("profile", "gpu")
        .order_by("gpu__index", "placement_start")
    )
    for inst in instances:
        placements[inst.gpu.index].append(
            {"profile": inst.profile.name, "start": inst.placement_start, "size": inst.placement_size}
        )
    allocated: dict[int, set[int]] = {i: set() for i in gpus}
    for index, start in (
        Allocation.objects.active()
        .filter(gpu__in=list(gpus.values()), mig_instance__isnull=False)
        .values_list("gpu__index", "mig_instance__placement_start")
    ):
        allocated[index].add(start)
    return {i: (g, placements[i], allocated[i]) for i, g in gpus.items()}


def plan_node(node: NodeCapacity, target: dict, backend: str) -> dict[int, GpuPlan]:
    """Placements per targeted GPU; raises ReconfigurationError naming the GPU that cannot take it.

    A GPU whose target has the same profiles as it has now keeps its instances where they are. On
    the agent path, allocated instances whose profile the target keeps stay in place (they are not
    destroyed); explicit {"profile", "start"} targets are taken as given.
    """
    layouts = current_layouts(node)
    plans: dict[int, GpuPlan] = {}
    for key in sorted(target, key=int):
        index = int(key)
        if index not in layouts:
            raise ReconfigurationError(f"GPU {index} of {node} is not present")
        gpu, before, allocated = layouts[index]
        wanted = target[key]
        product = find_product(gpu.catalog_product or gpu.product)
        if product is None:
            if wanted is None:
                plans[index] = GpuPlan(index, gpu.catalog_product, gpu.mig_mode_current, before, False, [])
                continue
            raise ReconfigurationError(f"GPU {index} ({gpu.product}) does not support MIG")
        if wanted is None:
            after_mig, after = False, []
        else:
            after_mig, after = True, _placements_for(product, index, wanted, before, allocated, gpu, backend)
        plans[index] = GpuPlan(index, product.key, gpu.mig_mode_current, before, after_mig, after)
    return plans


def _placements_for(product, index, wanted, before, allocated, gpu, backend) -> list[dict]:
    if wanted and isinstance(wanted[0], dict):
        fixed = [(w["profile"], int(w["start"])) for w in wanted]
        result = validate_layout(product, [], fixed=fixed)
    else:
        names = [product.profile(n).name if _known(product, n) else n for n in wanted]
        if gpu.mig_mode_current and sorted(names) == sorted(p["profile"] for p in before):
            return before  # same instances already there: leave the GPU alone
        current = [(p["profile"], p["start"]) for p in before]
        pool = Counter(names)
        keep = []
        if backend == Backend.AGENT:
            for name, start in current:
                if start in allocated and pool[name] > 0:
                    keep.append((name, start))
                    pool[name] -= 1
        result = validate_layout(product, list(pool.elements()), fixed=keep, prefer=current)
        if not result.valid and keep:
            result = validate_layout(product, names, prefer=current)
    if not result.valid:
        raise ReconfigurationError(f"GPU {index}: {result.reason}")
    return [p.to_dict() for p in result.placements]


def _known(product: Product, name: str) -> bool:
    try:
        product.profile(name)
    except KeyError:
        return False
    return True


# --- Impact: what a reconfiguration would touch ------------------------------------------------


@dataclass
class Impact:
    """What the confirmation page and the check step look at."""

    plans: dict[int, GpuPlan]
    affected: list[int]  # GPU indices whose pods must go and whose allocations count
    allocations: list  # active pools.Allocation rows on affected GPUs
    slots_before: dict[str, int]
    slots_after: dict[str, int]
    window_open: bool
    next_window: tuple[datetime, datetime] | None
    refusals: list[str]

    @property
    def changed(self) -> list[int]:
        return [i for i, p in self.plans.items() if p.changed]


def affected_gpus(node: NodeCapacity, plans: dict[int, GpuPlan], backend: str) -> list[int]:
    """GPUs whose pods must stop: every GPU on the operator path (the MIG manager refuses while any
    GPU pod runs on the node), only the changed ones on the agent path."""
    changed = [i for i, p in plans.items() if p.changed]
    if not changed:
        return []
    if backend == Backend.OPERATOR:
        return gpu_indices(node)
    return changed


def slot_counts(plans: dict[int, GpuPlan], *, after: bool) -> dict[str, int]:
    """Units offered by the targeted GPUs: MIG instances by profile, or "full GPU" for MIG-off GPUs."""
    counts: Counter = Counter()
    for plan in plans.values():
        mig, placements = (plan.after_mig, plan.after) if after else (plan.before_mig, plan.before)
        if mig:
            counts.update(_profile_counts(placements))
        else:
            counts["full GPU"] += 1
    return dict(sorted(counts.items()))


def window_state(node: NodeCapacity, now: datetime) -> tuple[bool, tuple[datetime, datetime] | None]:
    """(is a maintenance window open now, the next (opens, closes) if none is)."""
    windows = list(MaintenanceWindow.objects.for_node(node))
    if any(w.is_open(now) for w in windows):
        return True, None
    upcoming = [w.next_opening(now) for w in windows]
    upcoming = [u for u in upcoming if u is not None]
    return False, (min(upcoming) if upcoming else None)


def assess(
    node: NodeCapacity,
    target: dict,
    *,
    backend: str,
    drain: bool,
    force: bool,
    now: datetime | None = None,
    plans: dict[int, GpuPlan] | None = None,
) -> Impact:
    """Plan and judge a reconfiguration without changing anything (the confirmation page, the check)."""
    from pools.models import Allocation

    now = now or timezone.now()
    plans = plans if plans is not None else plan_node(node, target, backend)
    affected = affected_gpus(node, plans, backend)
    allocations = list(
        Allocation.objects.active()
        .filter(gpu__node=node, gpu__index__in=affected, gpu__lost_at__isnull=True)
        .select_related("project", "gpu", "mig_instance")
        .order_by("gpu__index", "id")
    )
    is_open, upcoming = window_state(node, now)
    refusals = []
    if allocations and not drain:
        held = Counter(a.gpu.index for a in allocations)
        where = ", ".join(f"GPU {i}: {n}" for i, n in sorted(held.items()))
        refusals.append(
            f"{len(allocations)} active allocation(s) on affected GPUs ({where}); choose drain to evict their pods"
        )
    if not is_open and not force:
        when = f"; the next opens {upcoming[0]:%Y-%m-%d %H:%M} UTC" if upcoming else "; none is scheduled"
        refusals.append(f"outside every maintenance window of {node}{when}; force to run now")
    return Impact(
        plans=plans,
        affected=affected,
        allocations=allocations,
        slots_before=slot_counts(plans, after=False),
        slots_after=slot_counts(plans, after=True),
        window_open=is_open,
        next_window=upcoming,
        refusals=refusals,
    )


def gpu_pods(client: kube.KubernetesClient, node: NodeCapacity, *, backend: str, affected) -> list[kube.Pod]:
    """GPU pods on the node that must go before apply: pods requesting nvidia.com/* on affected GPUs.

    On the operator path that is every GPU pod of the node (the MIG manager refuses while any runs).
    On the agent path a pod counts when discovery maps it to an affected GPU, or does not map it to
    any GPU at all (unknown is treated as affected).
    """
    pods = [
        p
        for p in client.list_pods_on_node(node.name)
        if not p.finished and any(r.startswith(RESOURCE_PREFIX) for r in p.requests)
    ]
    if backend == Backend.OPERATOR or not pods:
        return pods
    affected = set(affected)
    on_gpus: dict[str, set[int]] = {}
    rows = WorkloadProfile.objects.running().filter(cluster_id=node.cluster_id, pod_uid__in=[p.uid for p in pods])
    for uid, gpu_index, mig_gpu_index in rows.values_list("pod_uid", "gpu__index", "mig_instance__gpu__index"):
        index = gpu_index if gpu_index is not None else mig_gpu_index
        if index is not None:
            on_gpus.setdefault(uid, set()).add(index)
    return [p for p in pods if p.uid not in on_gpus or on_gpus[p.uid] & affected]


# --- Audit -----------------------------------------------------------------------------------


def audit(reconf, step: str, event: str, message: str = "", *, detail=None, task_id: str = "", actor=None):
    return MigReconfigurationStep.objects.create(
        reconfiguration_id=reconf.pk if hasattr(reconf, "pk") else reconf,
        step=step,
        event=event,
        message=message[:4000],
        detail=detail or {},
        task_id=(task_id or "")[:64],
        actor=actor,
    )


# --- Creating, resuming, rolling back ----------------------------------------------------------


def enqueue(reconf: MigReconfiguration, step: str, *, countdown: int | None = None) -> None:
    """Send the step's task after commit: the apply step of the agent backend goes to the node's queue."""
    from capacity.tasks import enqueue_reconfiguration_step

    pk, cluster, node, backend = reconf.pk, reconf.cluster.name, reconf.node.name, reconf.backend
    transaction.on_commit(
        lambda: enqueue_reconfiguration_step(pk, step, cluster=cluster, node=node, backend=backend, countdown=countdown)
    )


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
                created_by=actor if getattr(actor, "pk", None) else None,
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


def resume(reconf: MigReconfiguration, *, actor=None) -> MigReconfiguration:
    """Re-run the failed step (IllegalTransition unless failed). A re-run apply on the operator path
    uses a fresh config name, because the MIG manager only reacts to a changed label."""
    reconf.refresh_from_db()
    updates = {
        "state": State.PENDING,
        "error": "",
        "step_deadline": None,
        "claim_token": "",
        "claimed_at": None,
        "attempts": F("attempts") + 1,
    }
    if reconf.step == Step.APPLY and reconf.backend == Backend.OPERATOR:
        updates["config_name"] = ""
    with transaction.atomic():
        if MigReconfiguration.objects.filter(pk=reconf.pk, state=State.FAILED).update(**_stamp(**updates)) != 1:
            raise IllegalTransition(f"reconfiguration #{reconf.pk} is {reconf.state}, not failed")
        reconf.refresh_from_db()
        audit(reconf, reconf.step, Event.RESUMED, f"resumed at {reconf.step}", actor=_user(actor))
        enqueue(reconf, reconf.step)
    return reconf


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
                **_stamp(state=State.ROLLED_BACK, finished_at=now, claim_token="")
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
            created_by=_user(actor),
        )
        audit(reconf, reconf.step, Event.ROLLBACK, f"rolled back by #{back.pk}", actor=_user(actor))
        audit(
            back, Step.PLAN, Event.CREATED, f"roll-back of #{reconf.pk}", detail={"target": target}, actor=_user(actor)
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
            .update(**_stamp(state=State.CANCELLED, finished_at=timezone.now(), claim_token=""))
        )
        if updated != 1:
            raise IllegalTransition(f"reconfiguration #{reconf.pk} cannot be cancelled at {reconf.step}/{reconf.state}")
        audit(reconf, reconf.step, Event.CANCELLED, "cancelled", actor=_user(actor))
    reconf.refresh_from_db()
    return reconf


def _stamp(**fields) -> dict:
    """UPDATE ... SET fields plus updated_at (QuerySet.update() skips auto_now; sweep() reads it).

    Giving up the claim (claim_token="") ends its lease too."""
    fields["updated_at"] = timezone.now()
    if fields.get("claim_token") == "":
        fields["lease_expires_at"] = None
    return fields


def _user(actor):
    return actor if getattr(actor, "pk", None) else None


# --- Running one step ----------------------------------------------------------------------------


def run_step(reconf_id: int, step: str, *, token: str, now: datetime | None = None) -> str:
    """Claim `step` of the reconfiguration and run it once; returns what happened.

    "gone" (no such row), "stale" (the reconfiguration is at another step or closed), "busy"
    (another task holds the claim), "advanced", "waiting", "failed". Safe to call again with the
    same token after an interruption: the claim is re-taken and the step re-entered.
    """
    now = now or timezone.now()
    row = MigReconfiguration.objects.filter(pk=reconf_id).values("step", "state", "claim_token").first()
    if row is None:
        return "gone"
    if row["step"] != step:
        return "stale"
    if row["state"] in (State.PENDING, State.WAITING):
        condition = Q(state=row["state"])
    elif row["state"] == State.RUNNING and row["claim_token"] == token:
        condition = Q(state=State.RUNNING, claim_token=token)
    elif row["state"] == State.RUNNING:
        return "busy"
    else:
        return "stale"
    claimed = MigReconfiguration.objects.filter(condition, pk=reconf_id, step=step).update(
        **_stamp(
            state=State.RUNNING, claim_token=token, claimed_at=now, task_id=token[:64], lease_expires_at=lease_until()
        )
    )
    if claimed != 1:
        return "busy"
    timeout = step_timeout_s(step)
    if timeout is not None:
        MigReconfiguration.objects.filter(pk=reconf_id, step_deadline__isnull=True).update(
            step_deadline=now + timedelta(seconds=timeout)
        )
    reconf = MigReconfiguration.objects.select_related("cluster", "node", "layout").get(pk=reconf_id)
    if row["state"] == State.PENDING:
        audit(reconf, step, Event.STARTED, task_id=token)
    elif row["state"] == State.RUNNING:
        audit(reconf, step, Event.INFO, "re-entered after an interrupted run (task redelivered)", task_id=token)

    try:
        with Heartbeat(_owned(reconf, step, token)):
            result = STEPS[step](reconf, now)
        crash_point(f"reconfiguration.{step}")  # fault suite: the step's work is done, not yet recorded
    except ReconfigurationError as exc:
        return _fail(reconf, step, token, str(exc), exc.detail)
    except kube.NotFound as exc:
        return _fail(reconf, step, token, f"{reconf.node.name} or an object it needs is gone from the cluster: {exc}")
    except kube.KubernetesError as exc:
        return _fail(reconf, step, token, f"Kubernetes: {type(exc).__name__}: {exc}")
    except Exception as exc:  # a bug or an outside error: stop visibly, never half-silently
        logger.exception("reconfiguration #%s step %s failed", reconf_id, step)
        return _fail(reconf, step, token, f"{type(exc).__name__}: {exc}")

    if isinstance(result, Wait):
        return _wait(reconf, step, token, result, now)
    return _advance(reconf, step, token, result, now)


def _owned(reconf, step, token):
    return MigReconfiguration.objects.filter(pk=reconf.pk, step=step, state=State.RUNNING, claim_token=token)


def _advance(reconf, step, token, result: Advance, now) -> str:
    following = result.jump or ORDER[ORDER.index(step) + 1]
    done = following == Step.DONE
    fields = {
        MigReconfiguration.STEP_TIMESTAMPS[step]: now,
        "step": following,
        "state": State.SUCCEEDED if done else State.PENDING,
        "claim_token": "",
        "claimed_at": None,
        "step_deadline": None,
        **result.updates,
    }
    if done:
        fields["finished_at"] = now
    with transaction.atomic():
        if _owned(reconf, step, token).update(**_stamp(**fields)) != 1:
            return "busy"
        detail = dict(result.detail)
        if result.jump:
            detail["jump_to"] = result.jump
        audit(reconf, step, Event.COMPLETED, result.message, detail=detail, task_id=token)
        if not done:
            enqueue(reconf, following)
    return "advanced"


def _wait(reconf, step, token, result: Wait, now) -> str:
    reconf.refresh_from_db(fields=["step_deadline"])
    deadline = reconf.step_deadline
    if deadline is not None and now >= deadline:
        return _fail(reconf, step, token, f"timed out after {step_timeout_s(step)} s: {result.message}", result.detail)
    with transaction.atomic():
        if _owned(reconf, step, token).update(**_stamp(state=State.WAITING, claim_token="", claimed_at=None)) != 1:
            return "busy"
        last = MigReconfigurationStep.objects.filter(reconfiguration=reconf, step=step).order_by("-at", "-id").first()
        if last is None or last.event != Event.WAITING or last.message != result.message:
            audit(reconf, step, Event.WAITING, result.message, detail=result.detail, task_id=token)
        enqueue(reconf, step, countdown=poll_interval_s())
    return "waiting"


def _fail(reconf, step, token, message: str, detail: dict | None = None) -> str:
    with transaction.atomic():
        if (
            _owned(reconf, step, token).update(
                **_stamp(state=State.FAILED, failed_step=step, error=message, claim_token="", claimed_at=None)
            )
            != 1
        ):
            return "busy"
        audit(reconf, step, Event.FAILED, message, detail=detail, task_id=token)
    logger.warning("reconfiguration #%s failed at %s: %s", reconf.pk, step, message)
    return "failed"


# --- The steps ----------------------------------------------------------------------------------


def step_plan(reconf: MigReconfiguration, now: datetime) -> Advance:
    node = reconf.node
    if node.is_gone:
        raise ReconfigurationError(f"{node} is gone (discovery no longer sees it)")
    plans = plan_node(node, reconf.target, reconf.backend)
    product = next((p.product for p in plans.values() if p.product), "")
    affected = affected_gpus(node, plans, reconf.backend)
    plan = {
        "product": product,
        "gpus": {str(i): p.to_dict() for i, p in plans.items()},
        "changed": [i for i, p in plans.items() if p.changed],
        "affected": affected,
    }
    updates = {"plan": plan}
    if not reconf.previous:
        updates["previous"] = {
            "config": node.mig_config,
            "gpus": {str(i): {"mig": p.before_mig, "placements": p.before} for i, p in plans.items()},
        }
    detail = {"slots_before": slot_counts(plans, after=False), "slots_after": slot_counts(plans, after=True)}
    if not plan["changed"]:
        return Advance("nothing to change: the GPUs already have the target layout", detail, updates, Step.UNCORDON)
    changes = "; ".join(
        f"GPU {i}: {_describe(plans[i].before_mig, plans[i].before)} -> {_describe(plans[i].after_mig, plans[i].after)}"
        for i in plan["changed"]
    )
    return Advance(changes, detail, updates)


def _describe(mig: bool, placements: list[dict]) -> str:
    if not mig:
        return "MIG off"
    if not placements:
        return "MIG on, empty"
    return ",".join(f"{p['profile']}@{p['start']}" for p in placements)


def step_check(reconf: MigReconfiguration, now: datetime) -> Advance:
    node = NodeCapacity.objects.get(pk=reconf.node_id)
    if node.is_gone:
        raise ReconfigurationError(f"{node} is gone (discovery no longer sees it)")
    plans = {int(k): _gpu_plan(int(k), v, reconf.plan.get("product", "")) for k, v in reconf.plan["gpus"].items()}
    impact = assess(
        node, reconf.target, backend=reconf.backend, drain=reconf.drain, force=reconf.force, now=now, plans=plans
    )
    if impact.refusals:
        raise Refused("; ".join(impact.refusals), {"allocations": [a.pk for a in impact.allocations]})
    with mig_configs.client_for(reconf.cluster) as client:
        client.get_node(node.name)
    notes = []
    if impact.allocations:
        notes.append(f"{len(impact.allocations)} allocation(s) on affected GPUs: their pods will be evicted")
    notes.append("inside a maintenance window" if impact.window_open else "outside maintenance windows (forced)")
    return Advance("; ".join(notes), {"allocations": [a.pk for a in impact.allocations]})


def _gpu_plan(index: int, data: dict, product: str) -> GpuPlan:
    return GpuPlan(index, product, data["before_mig"], data["before"], data["mig"], data["placements"])


def step_cordon(reconf: MigReconfiguration, now: datetime) -> Advance:
    with mig_configs.client_for(reconf.cluster) as client:
        current = client.get_node(reconf.node.name)
        if reconf.was_cordoned is None:
            # Recorded before cordoning, so a re-run after a crash cannot mistake our cordon for the operator's.
            MigReconfiguration.objects.filter(pk=reconf.pk, was_cordoned__isnull=True).update(
                was_cordoned=current.unschedulable
            )
        if current.unschedulable:
            return Advance("the node was already cordoned")
        client.cordon(reconf.node.name)
    return Advance("node cordoned")


def step_drain(reconf: MigReconfiguration, now: datetime) -> Advance | Wait:
    blocked = []
    with mig_configs.client_for(reconf.cluster) as client:
        client.get_node(reconf.node.name)  # a vanished node has no pods either: do not mistake that for drained
        pods = gpu_pods(client, reconf.node, backend=reconf.backend, affected=reconf.plan.get("affected", []))
        if reconf.drain:
            for pod in pods:
                if pod.deleted:
                    continue
                try:
                    client.evict_pod(pod.namespace, pod.name, grace_period_s=_eviction_grace())
                except kube.TooManyRequests:
                    blocked.append(f"{pod.namespace}/{pod.name}")
                except kube.NotFound:
                    continue
            pods = gpu_pods(client, reconf.node, backend=reconf.backend, affected=reconf.plan.get("affected", []))
    if not pods:
        return Advance("no GPU pods left on the affected GPUs")
    names = [f"{p.namespace}/{p.name}" for p in pods]
    how = "evicting" if reconf.drain else "waiting for them to finish (drain not chosen)"
    message = f"{len(pods)} GPU pod(s) still running, {how}: {', '.join(names[:10])}"
    if blocked:
        message += f"; a PodDisruptionBudget blocks {', '.join(blocked[:10])}"
    return Wait(message, {"pods": names})


def _eviction_grace() -> int | None:
    value = getattr(settings, "MIG_EVICTION_GRACE_S", None)
    return None if value is None else int(value)


def step_apply(reconf: MigReconfiguration, now: datetime) -> Advance | Wait:
    if reconf.backend == Backend.AGENT:
        return _apply_agent(reconf)
    return _apply_operator(reconf)


def config_name_for(reconf: MigReconfiguration, current_label: str) -> str:
    """The mig.config value to set: the named config or layout asked for when it still means our
    target and differs from the label now; otherwise gpuaas-r<id> (-<attempt> after a resume), so
    the MIG manager always sees a changed label."""
    source = reconf.source
    if not reconf.attempts and source and source != current_label:
        if mig_configs.is_named_config(source):
            return source
        layout = reconf.layout
        if layout is not None and source == layout.config_name:
            indices = [int(k) for k in reconf.target]
            if {str(i): v for i, v in layout.targets_for(indices).items()} == reconf.target:
                return source
    suffix = f"-{reconf.attempts}" if reconf.attempts else ""
    return f"{GPUAAS_CONFIG_PREFIX}r{reconf.pk}{suffix}"


def _apply_operator(reconf: MigReconfiguration) -> Advance | Wait:
    node_name = reconf.node.name
    with mig_configs.client_for(reconf.cluster) as client:
        labels = client.get_node(node_name).labels
        current = labels.get(mig_configs.MIG_CONFIG_LABEL, "")
        if not reconf.config_name:
            reconf.config_name = config_name_for(reconf, current)
            MigReconfiguration.objects.filter(pk=reconf.pk, config_name="").update(config_name=reconf.config_name)
            audit(
                reconf, Step.APPLY, Event.INFO, f"config {reconf.config_name} chosen (label was {current or 'unset'})"
            )
        if current != reconf.config_name:
            mig_configs.write_mig_parted_config(reconf.cluster, client)
            client.patch_node_labels(
                node_name, {mig_configs.MIG_CONFIG_LABEL: reconf.config_name, mig_configs.MIG_STATE_LABEL: "pending"}
            )
            return Wait(f"set {mig_configs.MIG_CONFIG_LABEL}={reconf.config_name}; MIG manager pending")
    state = labels.get(mig_configs.MIG_STATE_LABEL, "")
    if state == "success":
        return Advance(f"MIG manager applied {reconf.config_name} ({mig_configs.MIG_STATE_LABEL}=success)")
    if state == "failed":
        raise ReconfigurationError(
            f"the GPU Operator MIG manager failed to apply {reconf.config_name} ({mig_configs.MIG_STATE_LABEL}=failed)"
        )
    return Wait(f"{mig_configs.MIG_STATE_LABEL}={state or 'unset'}")


def _apply_agent(reconf: MigReconfiguration) -> Advance:
    from capacity.adapters import nvml
    from capacity.mig.catalog import get_product

    product = get_product(reconf.plan["product"])
    done = {}
    try:
        with nvml.session(kube.api_url_for(reconf.cluster), reconf.node.name) as session:
            for index in reconf.plan["changed"]:
                gpu = reconf.plan["gpus"][str(index)]
                wanted = [(product.profile(p["profile"]), int(p["start"])) for p in gpu["placements"]]
                done[str(index)] = nvml.apply_gpu_layout(
                    session, index, product, mig_enabled=gpu["mig"], instances=wanted
                )
    except nvml.LayoutError as exc:
        raise ReconfigurationError(f"NVML: {exc}", {"applied": done}) from None
    except nvml.NvmlError as exc:
        raise ReconfigurationError(f"NVML: {exc}", {"applied": done}) from None
    summary = "; ".join(
        f"GPU {i}: {len(r['destroyed'])} destroyed, {len(r['created'])} created, {len(r['kept'])} kept"
        for i, r in done.items()
    )
    return Advance(f"NVML applied the plan ({summary})", {"applied": done})


def step_verify(reconf: MigReconfiguration, now: datetime) -> Advance | Wait:
    if reconf.backend == Backend.OPERATOR:
        with mig_configs.client_for(reconf.cluster) as client:
            labels = client.get_node(reconf.node.name).labels
        config, state = labels.get(mig_configs.MIG_CONFIG_LABEL), labels.get(mig_configs.MIG_STATE_LABEL)
        if config != reconf.config_name:
            raise ReconfigurationError(
                f"{mig_configs.MIG_CONFIG_LABEL} is {config!r}, not {reconf.config_name!r}: someone changed it"
            )
        if state == "failed":
            raise ReconfigurationError(f"{mig_configs.MIG_STATE_LABEL}=failed for {config}")
        if state != "success":
            return Wait(f"{mig_configs.MIG_STATE_LABEL}={state or 'unset'}")
    error = rediscover(reconf)
    if error:
        return Wait(f"rediscovery of {reconf.node.name} failed: {error}")
    layouts = current_layouts(reconf.node)
    mismatches, observed = [], {}
    for key, gpu in reconf.plan["gpus"].items():
        index = int(key)
        if index not in layouts:
            raise ReconfigurationError(f"GPU {index} is no longer present on {reconf.node}")
        row, placements, _ = layouts[index]
        observed[key] = placements
        if row.mig_mode_current != gpu["mig"]:
            mismatches.append(
                f"GPU {index}: MIG {'on' if row.mig_mode_current else 'off'}, planned {_describe(gpu['mig'], [])}"
            )
            continue
        if reconf.backend == Backend.AGENT:
            if _placement_set(placements) != _placement_set(gpu["placements"]):
                mismatches.append(
                    f"GPU {index}: {_describe(True, placements)}, planned {_describe(True, gpu['placements'])}"
                )
        elif _profile_counts(placements) != _profile_counts(gpu["placements"]):
            mismatches.append(
                f"GPU {index}: {_describe(True, placements)}, planned {_describe(True, gpu['placements'])}"
            )
    if mismatches:
        return Wait("rediscovery does not show the plan yet: " + "; ".join(mismatches), {"observed": observed})
    updates = {}
    moved = [
        k for k, g in reconf.plan["gpus"].items() if _placement_set(observed[k]) != _placement_set(g["placements"])
    ]
    if moved:  # operator path: mig-parted chose other starts for the same profiles
        plan = dict(reconf.plan)
        plan["gpus"] = {k: {**g, "placements": observed[k]} if k in moved else g for k, g in plan["gpus"].items()}
        updates["plan"] = plan
    message = "rediscovery shows the planned instances"
    if moved:
        message += f" (mig-parted placed GPU {', '.join(moved)} differently; recorded)"
    notes = reattach_allocations(reconf)
    return Advance(message, {"observed": observed, "allocations": notes}, updates)


def rediscover(reconf: MigReconfiguration) -> str:
    """Refresh the node's GpuCapacity/MigInstance rows from its NVML (the discovery inventory, run here on
    the node's own queue); returns the NVML error, "" if it worked."""
    from . import inventory

    result = inventory.inventory_node(reconf.cluster_id, reconf.node.name, api_url=kube.api_url_for(reconf.cluster))
    return result.errors.get(reconf.node.name, "")


def reattach_allocations(reconf: MigReconfiguration) -> list[str]:
    """Point active MIG allocations whose instance is gone at the new instance of the same profile at the
    same start on the same GPU (the unit is equivalent). Allocations left without one are reported."""
    from pools.models import Allocation

    notes = []
    orphans = (
        Allocation.objects.active()
        .filter(gpu__node_id=reconf.node_id, mig_instance__isnull=False)
        .exclude(mig_instance__state="active")
        .select_related("mig_instance__profile")
        .order_by("id")
    )
    for allocation in orphans:
        old = allocation.mig_instance
        replacement = (
            MigInstance.objects.active()
            .filter(gpu_id=allocation.gpu_id, profile_id=old.profile_id, placement_start=old.placement_start)
            .exclude(pk__in=Allocation.objects.active().filter(mig_instance__isnull=False).values("mig_instance"))
            .first()
        )
        if replacement is not None and Allocation.objects.filter(pk=allocation.pk, mig_instance=old).update(
            mig_instance=replacement
        ):
            notes.append(f"allocation #{allocation.pk} moved to the new {old.profile.name} at {old.placement_start}")
        else:
            notes.append(
                f"allocation #{allocation.pk}: its {old.profile.name} at {old.placement_start} is gone and no "
                f"equivalent instance exists; release or move it"
            )
    for note in notes:
        audit(reconf, Step.VERIFY, Event.INFO, note)
    return notes


def step_uncordon(reconf: MigReconfiguration, now: datetime) -> Advance:
    reconf.refresh_from_db(fields=["was_cordoned"])
    if reconf.was_cordoned is not False:
        why = "it was cordoned before gpuaas started" if reconf.was_cordoned else "gpuaas never cordoned it"
        return Advance(f"node left as it was ({why})")
    with mig_configs.client_for(reconf.cluster) as client:
        client.uncordon(reconf.node.name)
    return Advance("node uncordoned")


STEPS: dict[str, Callable[[MigReconfiguration, datetime], Advance | Wait]] = {
    Step.PLAN: step_plan,
    Step.CHECK: step_check,
    Step.CORDON: step_cordon,
    Step.DRAIN: step_drain,
    Step.APPLY: step_apply,
    Step.VERIFY: step_verify,
    Step.UNCORDON: step_uncordon,
}


# --- Sweeping lost work ----------------------------------------------------------------------


def sweep(now: datetime | None = None) -> dict[str, int]:
    """Recover lost work (beat, every MIG_RECONFIG_SWEEP_S): a running step whose lease ran out
    belongs to a dead worker and goes back to pending; a pending or waiting step nobody touched for
    idle_s() (its message was lost, or its worker died before claiming) is enqueued again. Each
    recovery is claimed with a conditional UPDATE (two sweeps never both re-send a step), and a
    duplicate message is harmless anyway: the step's claim lets one through.
    Recovery takes at most WORKFLOW_LEASE_S + MIG_RECONFIG_SWEEP_S after the worker's last heartbeat."""
    now = now or timezone.now()
    stale = 0
    for reconf in MigReconfiguration.objects.stale(now).select_related("cluster", "node"):
        with transaction.atomic():
            if (
                MigReconfiguration.objects.filter(
                    pk=reconf.pk, state=State.RUNNING, claim_token=reconf.claim_token
                ).update(**_stamp(state=State.PENDING, claim_token="", claimed_at=None))
                == 1
            ):
                audit(
                    reconf,
                    reconf.step,
                    Event.INFO,
                    f"worker lost (claim {reconf.claim_token or '-'} expired); step re-queued",
                )
                enqueue(reconf, reconf.step)
                stale += 1
    idle_before = now - timedelta(seconds=idle_s())
    requeued = 0
    for reconf in MigReconfiguration.objects.filter(
        state__in=[State.PENDING, State.WAITING], updated_at__lt=idle_before
    ).select_related("cluster", "node"):
        with transaction.atomic():
            # Stamping updated_at claims the re-send and spaces the next one by idle_s().
            if MigReconfiguration.objects.filter(
                pk=reconf.pk, state=reconf.state, step=reconf.step, updated_at=reconf.updated_at
            ).update(updated_at=now):
                enqueue(reconf, reconf.step)
                requeued += 1
    if stale or requeued:
        logger.info(
            "reconfiguration sweep: %d dead workers' steps re-queued, %d lost messages re-sent", stale, requeued
        )
    return {"stale_claims": stale, "requeued": requeued}

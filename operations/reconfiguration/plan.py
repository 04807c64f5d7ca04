"""Planning a reconfiguration without touching anything: the target, the per-GPU plan, its impact.

The plan step and the check step call these, and so do the admin's confirmation page and the API's
validation, so what an operator is shown is what the workflow will do.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from capacity.adapters import kubernetes as kube
from capacity.choices import ReconfigurationBackend as Backend
from capacity.mig.catalog import Product, find_product
from capacity.mig.layout import validate_layout
from capacity.models import GpuCapacity, MaintenanceWindow, MigInstance, MigLayout, NodeCapacity, WorkloadProfile
from capacity.services import mig_configs
from pools.models import Allocation

from .outcomes import ReconfigurationError

RESOURCE_PREFIX = "nvidia.com/"


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
        return self.before_mig != self.after_mig or placement_set(self.before) != placement_set(self.after)

    def to_dict(self) -> dict:
        return {
            "mig": self.after_mig,
            "placements": self.after,
            "before_mig": self.before_mig,
            "before": self.before,
            "changed": self.changed,
        }


def placement_set(placements: list[dict]) -> set[tuple[str, int]]:
    return {(p["profile"], int(p["start"])) for p in placements}


def profile_counts(placements: list[dict]) -> Counter:
    return Counter(p["profile"] for p in placements)


def current_layouts(node: NodeCapacity) -> dict[int, tuple[GpuCapacity, list[dict], set[int]]]:
    """index -> (GPU, its active instances as placements, starts of instances with active allocations)."""
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
            counts.update(profile_counts(placements))
        else:
            counts["full GPU"] += 1
    return dict(sorted(counts.items()))


def window_state(node: NodeCapacity, now: datetime) -> tuple[bool, tuple[datetime, datetime] | None]:
    """(is a maintenance window open now, the next (opens, closes) if none is)."""
    windows = list(MaintenanceWindow.objects.for_node(node))
    if any(w.is_open(now) for w in windows):
        return True, None
    return False, next_window(node, now, windows)


def next_window(node: NodeCapacity, now: datetime, windows=None) -> tuple[datetime, datetime] | None:
    """The earliest (opens, closes) of the node's maintenance windows after `now`, None if none is scheduled."""
    windows = MaintenanceWindow.objects.for_node(node) if windows is None else windows
    openings = [o for o in (w.next_opening(now) for w in windows) if o is not None]
    return min(openings) if openings else None


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

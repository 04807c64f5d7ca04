"""What a (project, cluster) should hold in Kubernetes, read from the database: names, labels, quotas, claim
templates, taints and tolerations (Desired), and the borrowed units a project runs on (docs/queue.md)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from django.db.models import Q

from capacity.adapters.cel import checked_device_selector
from capacity.choices import Binding, SharingStrategy, SpecKind
from capacity.models import Cluster, SpecAndCount, TimeSlicingPolicy
from tenancy.models import Project

from ..choices import SHARE_PRIORITY_CLASSES, LoanState
from ..models import LABEL_PREFIX, Allocation, GpuPool, Loan, claim_template_name

MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuaas"}
DEDICATED_TAINT = f"{LABEL_PREFIX}dedicated"
DEFAULT_TOLERATIONS_ANNOTATION = "scheduler.alpha.kubernetes.io/defaultTolerations"
TOLERATIONS_WHITELIST_ANNOTATION = "scheduler.alpha.kubernetes.io/tolerationsWhitelist"
# Tolerations a GPU namespace's pods may carry besides their project's: the GPU Operator's usual node
# taint, and the two DefaultTolerationSeconds adds to every pod before PodTolerationRestriction runs.
ALLOWED_TOLERATIONS = (
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
)
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-", "nvidia.com/NVIDIA_")  # last: vGPU types
# NVIDIA's DRA driver: its name (the attribute domain in CEL) and its DeviceClasses (docs/dra.md).
DRA_DRIVER = "gpu.nvidia.com"
DRA_CLASS = {SpecKind.FULL: "gpu.nvidia.com", SpecKind.MIG: "mig.nvidia.com"}
POOL_LABEL = f"{LABEL_PREFIX}pool"
# Borrowed units (docs/queue.md, Borrowing): the borrower's extra quota and the low priority of its pods there.
BORROWED_QUOTA = "gpuaas-borrowed"
BORROWED_PRIORITY_CLASS = "gpuaas-borrowed"
BORROWED_PRIORITY = -100
# On a namespace whose project holds lent units on the cluster and none of its own: every GPU pod there is a
# borrowed one, and the ValidatingAdmissionPolicy deploy/admission-policy-borrowed.yaml admits it only with
# BORROWED_PRIORITY_CLASS (docs/queue.md, Borrowing).
BORROWING_LABEL = f"{LABEL_PREFIX}borrowing"


def borrowed_template_name(loan_id: int) -> str:
    return f"gpuaas-borrowed-{loan_id}"


def project_label(project: Project | int) -> str:
    pk = project if isinstance(project, int) else project.pk
    return f"{LABEL_PREFIX}project-{pk}"


def node_selector(project: Project) -> str:
    return f"{project_label(project)}=true"


def dedicated_value(project: Project | int) -> str:
    pk = project if isinstance(project, int) else project.pk
    return f"project-{pk}"


def toleration_annotations(project: Project) -> dict[str, str]:
    """The namespace's PodTolerationRestriction annotations: its pods tolerate their project's dedicated nodes
    (by default) and may tolerate no other project's."""
    own = {"key": DEDICATED_TAINT, "operator": "Equal", "value": dedicated_value(project), "effect": "NoSchedule"}
    return {
        DEFAULT_TOLERATIONS_ANNOTATION: json.dumps([own], separators=(",", ":")),
        TOLERATIONS_WHITELIST_ANNOTATION: json.dumps([own, *ALLOWED_TOLERATIONS], separators=(",", ":")),
    }


def placement_name(pool_id: int) -> str:
    return f"gpuaas-pool-{pool_id}"


def placement_data(pool: GpuPool, mps_env: dict[str, str] | None = None) -> dict[str, str]:
    """The pool's scheduling (node selector and node affinity on its pool and tier labels) as ConfigMap data; a
    shared pool adds the PriorityClass its pods should carry (its operator-chosen share priority), an MPS pool the
    CUDA MPS client variables of its nodes' policy (`mps_env`), so `envFrom: configMapRef` applies them."""
    scheduling = pool.scheduling()
    data = {
        "tier": pool.tier,
        "nodeSelector.json": json.dumps(scheduling["nodeSelector"], sort_keys=True),
        "affinity.json": json.dumps(scheduling["affinity"], sort_keys=True),
    }
    if pool.is_shared:
        data["priorityClassName"] = pool.priority_class_name
    data.update(mps_env or {})
    return data


def mps_environment(cluster: Cluster, node_groups: set[str]) -> dict[str, str]:
    """The CUDA MPS client variables for pods on nodes of `node_groups` (TimeSlicingPolicy.client_environment, the
    group's own policy else the cluster-wide one); where groups differ, the tighter value of each wins."""
    policies = {
        p.node_group: p
        for p in TimeSlicingPolicy.objects.filter(cluster=cluster, enabled=True, strategy=SharingStrategy.MPS)
    }
    merged: dict[str, str] = {}
    for group in sorted(node_groups):
        policy = policies.get(group) or policies.get("")
        for name, value in (policy.client_environment if policy else {}).items():
            merged[name] = min(merged.get(name, value), value, key=_mps_amount)
    return merged


def _mps_amount(value: str) -> int:
    """The number in "0=2048M" or "25", to compare two limits."""
    return int(value.rsplit("=", 1)[-1].rstrip("M"))


@dataclass
class Desired:
    """What the cluster should hold for one project: quotas to apply and delete, node labels to patch."""

    namespace: str
    node_selector: str
    quotas: dict[str, dict[str, str]] = field(default_factory=dict)
    stale_quotas: list[str] = field(default_factory=list)
    node_labels: dict[str, dict[str, str | None]] = field(default_factory=dict)
    cleaned_pools: list[int] = field(default_factory=list)
    dra: bool = False  # the cluster binds by DRA: claim_templates is the complete set to hold
    borrowed: int = 0  # units lent to the project now (Loan, granted): in its quota, under BORROWED_PRIORITY_CLASS
    reclaiming: int = 0  # units being taken back from it (grace period): no longer in its quota
    borrowing: str | None = None  # BORROWING_LABEL's value: "only" when it runs on lent units only, else None
    ever_borrowed: bool = False  # it has had loans here: a stale BORROWING_LABEL may need removing
    claim_templates: dict[str, ClaimTemplate] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    node_taints: dict[str, str | None] = field(default_factory=dict)  # node -> dedicated taint value, None: none
    placements: dict[str, dict[str, str]] = field(default_factory=dict)  # ConfigMap name -> data
    stale_placements: list[str] = field(default_factory=list)
    priority_classes: dict[str, int] = field(default_factory=dict)  # shared pools' PriorityClasses: name -> value


@dataclass(frozen=True)
class ClaimTemplate:
    """One ResourceClaimTemplate gpuaas holds in a project's namespace: one device of the pool's units of one kind."""

    pool_id: int
    spec: dict

    @property
    def labels(self) -> dict[str, str]:
        return {**MANAGED_BY, POOL_LABEL: str(self.pool_id)}


def uuid_selector(uuids: list[str]) -> str:
    """The CEL expression admitting exactly these devices of the NVIDIA driver, checked with the CEL library
    before it is written: it compiles, admits each UUID, and refuses near misses (each UUID with a character
    more or less, another device's UUID). SelectorError if not (capacity/adapters/cel.py)."""
    ordered = sorted(uuids)
    listed = ", ".join(json.dumps(u) for u in ordered)
    expression = f'device.attributes["{DRA_DRIVER}"].uuid in [{listed}]'
    near = {f"{u}0" for u in ordered} | {u[:-1] for u in ordered} | {"GPU-00000000-0000-0000-0000-000000000000", ""}
    return checked_device_selector(expression, driver=DRA_DRIVER, admitted=ordered, refused=sorted(near - set(ordered)))


def claim_template_spec(kind: str, uuids: list[str]) -> dict:
    """ResourceClaimTemplate.spec: one request of exactly one device of the kind's class, among `uuids`.
    allocationMode and count are written as the API server defaults them, so a read-back compares equal."""
    return {
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu" if kind == SpecKind.FULL else "mig",
                        "exactly": {
                            "deviceClassName": DRA_CLASS[kind],
                            "selectors": [{"cel": {"expression": uuid_selector(uuids)}}],
                            "allocationMode": "ExactCount",
                            "count": 1,
                        },
                    }
                ]
            }
        }
    }


def desired_state(project: Project, cluster: Cluster) -> Desired:
    """Compute what the cluster should hold for `project` from the database (three queries)."""
    pools = list(
        GpuPool.objects.on_cluster(cluster)
        .filter(project=project)
        .filter(Q(released_at__isnull=True) | Q(deprovisioned_at__isnull=True))
        .select_related("request")
    )
    held = {p.pk for p in pools if p.released_at is None}
    gone = [p.pk for p in pools if p.released_at is not None]
    desired = Desired(
        namespace=project.namespace,
        node_selector=node_selector(project),
        cleaned_pools=gone,
        annotations=toleration_annotations(project),
    )

    touched: dict[int, set[str]] = defaultdict(set)  # every node a unit of the pool was ever on
    carrying: dict[int, set[str]] = defaultdict(set)  # nodes with a unit the pool still holds
    granted: Counter = Counter()
    # A pool across clusters (PoolCluster): only its units on this cluster count here.
    rows = Allocation.objects.filter(pool_id__in=[p.pk for p in pools], gpu__node__cluster=cluster).values_list(
        "pool_id",
        "gpu__node__name",
        "gpu__node_id",
        "resource_name",
        "released_at",
        "kind",
        "profile_name",
        "gpu__uuid",
        "mig_instance__uuid",
        "gpu__node__node_group",
    )
    node_ids: set[int] = set()
    mps_groups: dict[int, set[str]] = defaultdict(set)  # MPS pool -> node groups of its units
    units: dict[tuple[int, str, str], list[str]] = defaultdict(list)  # (pool, kind, profile) -> device uuids
    for pool_id, node_name, node_id, resource, released_at, kind, profile, gpu_uuid, mig_uuid, group in rows:
        touched[pool_id].add(node_name)
        if pool_id in held and released_at is None:
            carrying[pool_id].add(node_name)
            if kind == SpecKind.MPS:
                mps_groups[pool_id].add(group)
            granted[resource] += 1
            node_ids.add(node_id)
            if kind in DRA_CLASS:  # time-slice replicas have no DRA device of their own
                units[(pool_id, kind, profile if kind == SpecKind.MIG else "")].append(mig_uuid or gpu_uuid)
    own_units = sum(granted.values())
    borrowed_nodes, lent_nodes = _borrowed_units(project, cluster, desired, granted, units, node_ids)
    desired.ever_borrowed = bool(lent_nodes)
    desired.borrowing = "only" if desired.borrowed and not own_units else None
    desired.dra = cluster.binding == Binding.DRA
    if desired.dra:
        for key, uuids in sorted(units.items(), key=lambda item: str(item[0])):
            if key[0] == "loan":  # ("loan", loan id, kind, lender pool id): the borrower's template
                _, loan_id, kind, pool_id = key
                name = borrowed_template_name(loan_id)
            else:
                pool_id, kind, profile = key
                name = claim_template_name(pool_id, kind, profile)
            desired.claim_templates[name] = ClaimTemplate(pool_id, claim_template_spec(kind, uuids))

    offered = set(SpecAndCount.objects.filter(node_id__in=node_ids).values_list("resource_name", flat=True).distinct())
    hard = {f"requests.{r}": "0" for r in offered | {"nvidia.com/gpu"} if r.startswith(GPU_RESOURCE_PREFIXES)}
    hard.update({f"requests.{r}": str(n) for r, n in granted.items()})
    desired.quotas = {f"gpuaas-{pk}": dict(sorted(hard.items())) for pk in sorted(held)}
    desired.stale_quotas = [f"gpuaas-{pk}" for pk in gone]
    mps_env = {pk: mps_environment(cluster, groups) for pk, groups in mps_groups.items()}
    desired.placements = {
        placement_name(p.pk): placement_data(p, mps_env.get(p.pk)) for p in pools if p.released_at is None
    }
    desired.priority_classes = dict(
        sorted(SHARE_PRIORITY_CLASSES[p.share_priority] for p in pools if p.released_at is None and p.is_shared)
    )
    desired.stale_placements = [placement_name(pk) for pk in gone]
    if desired.borrowed or desired.reclaiming:  # while reclaiming: the quota without the unit (no new pods)
        desired.quotas[BORROWED_QUOTA] = dict(sorted(hard.items()))
    elif lent_nodes:  # every loan of the project here has ended: its quota goes
        desired.stale_quotas.append(BORROWED_QUOTA)

    # A unit released on its own (monitoring's idle release) takes its node out of the pool too.
    for pk in sorted(touched):
        for node in touched[pk]:
            desired.node_labels.setdefault(node, {})[f"{LABEL_PREFIX}pool-{pk}"] = (
                "true" if node in carrying[pk] else None
            )
    project_nodes = set().union(*carrying.values()) | borrowed_nodes
    for node in lent_nodes:
        desired.node_labels.setdefault(node, {})
    for node, labels in desired.node_labels.items():
        labels[project_label(project)] = "true" if node in project_nodes else None
    desired.node_taints = dedicated_taints(cluster, set(desired.node_labels))
    return desired


def dedicated_taints(cluster: Cluster, nodes: set[str]) -> dict[str, str | None]:
    """Node -> the dedicated taint's value it should carry: its one holder's, or None when several projects
    (or none) hold units there. Computed over every project (one query), so each project's reconcile
    writes the same answer for a node they share."""
    holders: dict[str, set[int]] = {name: set() for name in nodes}
    rows = Allocation.objects.active().filter(gpu__node__cluster=cluster, gpu__node__name__in=nodes)
    for name, project_id in rows.values_list("gpu__node__name", "project_id").distinct():
        holders[name].add(project_id)
    # A borrower's pods must land on the lent unit's node: a lent node is shared, so it carries no taint.
    loans = Loan.objects.filter(
        state=LoanState.ACTIVE, allocation__gpu__node__cluster=cluster, allocation__gpu__node__name__in=nodes
    )
    for name, project_id in loans.values_list("allocation__gpu__node__name", "borrower_id").distinct():
        holders[name].add(project_id)
    return {name: dedicated_value(next(iter(p))) if len(p) == 1 else None for name, p in sorted(holders.items())}


def _borrowed_units(project, cluster, desired: Desired, granted: Counter, units: dict, node_ids: set) -> tuple:
    """Add the units lent to `project` on `cluster` to its grant; (nodes of granted loans, nodes of any loan).

    Under DRA each loan gets its own template (keyed by the loan, labelled with the lender's pool) admitting
    the lent UUID; under the device plugin the quota counts it and the node carries the project label.
    """
    rows = Loan.objects.filter(borrower=project, allocation__gpu__node__cluster=cluster).values_list(
        "pk",
        "state",
        "lender_pool_id",
        "allocation__gpu__node__name",
        "allocation__gpu__node_id",
        "allocation__resource_name",
        "allocation__kind",
        "allocation__gpu__uuid",
        "allocation__mig_instance__uuid",
    )
    borrowed_nodes: set[str] = set()
    lent_nodes: set[str] = set()
    for pk, state, pool_id, node_name, node_id, resource, kind, gpu_uuid, mig_uuid in rows:
        lent_nodes.add(node_name)
        if state == LoanState.RECLAIMING:
            desired.reclaiming += 1
            node_ids.add(node_id)  # its resources stay listed, at "0" unless granted otherwise
        if state != LoanState.ACTIVE:
            continue
        borrowed_nodes.add(node_name)
        granted[resource] += 1
        node_ids.add(node_id)
        desired.borrowed += 1
        if kind in DRA_CLASS:
            units[("loan", pk, kind, pool_id)] = [mig_uuid or gpu_uuid]
    return borrowed_nodes, lent_nodes

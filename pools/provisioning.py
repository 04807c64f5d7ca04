"""Provisioning pools in Kubernetes, and undoing it after release.

What gpuaas writes, per (project, cluster), all through capacity/adapters/kubernetes/:

- the project's namespace (created if missing), annotated
  `scheduler.alpha.kubernetes.io/node-selector: gpuaas.io/project-<project id>=true`, so with the
  PodNodeSelector admission plugin its pods land only on nodes carrying the project's units;
- on every node carrying a unit of a held pool: the labels `gpuaas.io/pool-<pool id>=true` (target
  one pool with a nodeSelector) and `gpuaas.io/project-<project id>=true` (the namespace's selector).
  Keys, not values, carry the ids because one node may carry units of several pools and projects;
- one ResourceQuota `gpuaas-<pool id>` per held pool in that namespace. Kubernetes enforces every
  quota of a namespace independently (a pod must fit all of them), so each quota carries the
  namespace's total over all held pools of the project on that cluster: two pools of 2 x 3g.40gb
  give two quotas of `requests.nvidia.com/mig-3g.40gb: "4"`. GPU resources the nodes offer but the
  project was not granted are listed with "0", so the project cannot take a neighbour's units.
- on a DRA cluster (Cluster.binding, docs/dra.md), one ResourceClaimTemplate per held pool and unit kind,
  `gpuaas-<pool id>-gpu` / `gpuaas-<pool id>-mig-<profile>`, whose CEL selector admits only the UUIDs of
  the units the pool holds now: a pod that references it gets one of the pool's devices, never another's.
  Templates are immutable in Kubernetes, so a changed unit set (release, reconfiguration) is written as
  delete + create; claims already made from the old one keep their device until their pod ends.
- on every node whose held units all belong to one project: the taint `gpuaas.io/dedicated=project-<id>:NoSchedule`
  (removed once another project holds a unit there), and on the project's namespace the matching
  default toleration and the tolerations it may carry, through the PodTolerationRestriction admission
  plugin's annotations `scheduler.alpha.kubernetes.io/defaultTolerations` and
  `.../tolerationsWhitelist` (kubernetes plugin/pkg/admission/podtolerationrestriction): the device
  plugin binds by count, so only the taint keeps other projects' pods off a dedicated node. A node
  several projects share says so on their pools ("shared node: binding is by count", GpuPool.with_card).
- one ConfigMap `gpuaas-pool-<pool id>` per held pool in that namespace with the pool's scheduling
  (GpuPool.scheduling(): a node selector and the equivalent required node affinity on the pool's
  label and its tier's `gpuaas.io/tier`), for the team's pod specs; a released pool's is deleted.

A pool across clusters (PoolCluster rows, docs/pools.md) is written on each of its clusters with only
that cluster's units: reconcile(project, cluster) reads the pools on `cluster` (GpuPool.on_cluster) and
their allocations there. Provisioning and clean-up run cluster by cluster and record each one's outcome
on its PoolCluster.

`reconcile()` makes the cluster match the database and is idempotent: provisioning, retries and
clean-up after release all call it. Released pools lose their quota and pool label, and nodes
left with no unit of the project lose the project label; the namespace itself stays.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from capacity.adapters.cel import checked_device_selector
from capacity.adapters.kubernetes import NODE_SELECTOR_ANNOTATION, KubernetesClient, KubernetesError, Node, NotFound
from capacity.choices import Binding, SharingStrategy, SpecKind
from capacity.models import Cluster, SpecAndCount, TimeSlicingPolicy
from core.leases import Heartbeat, crash_point
from tenancy.models import Project

from . import services
from .choices import SHARE_PRIORITY_CLASSES, LoanState, PoolState
from .models import LABEL_PREFIX, Allocation, GpuPool, Loan, PoolCluster, PoolRequestTransition, claim_template_name

logger = logging.getLogger(__name__)

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


def reconcile(project: Project, cluster: Cluster, *, client_factory=KubernetesClient.for_cluster) -> Desired:
    """Make `cluster` match the database for `project` (idempotent); raises KubernetesError.

    On success, released pools of the project on that cluster are marked deprovisioned.
    """
    desired = desired_state(project, cluster)
    with client_factory(cluster) as kube:
        labels = {**MANAGED_BY, **({BORROWING_LABEL: desired.borrowing} if desired.borrowing else {})}
        kube.ensure_namespace(
            desired.namespace, labels=labels, annotations=desired.annotations, node_selector=desired.node_selector
        )
        if desired.ever_borrowed and not desired.borrowing:
            kube.patch_namespace(desired.namespace, labels={BORROWING_LABEL: None})
        if desired.borrowed:
            kube.ensure_priority_class(
                BORROWED_PRIORITY_CLASS,
                BORROWED_PRIORITY,
                labels=MANAGED_BY,
                description="gpuaas: pods on borrowed (lent, preemptible) GPU units; evicted when the lender reclaims.",
            )
        for name, value in desired.priority_classes.items():
            kube.ensure_priority_class(
                name,
                value,
                labels=MANAGED_BY,
                description="gpuaas: pods of time-sliced and MPS pools of this share priority (set by operators); "
                "over-share enforcement evicts lower classes first.",
            )
        for name, hard in desired.quotas.items():
            kube.apply_resource_quota(desired.namespace, name, hard, labels=MANAGED_BY)
        crash_point("provisioning.quotas")  # fault suite: quotas written, node labels not yet
        if desired.dra:
            apply_claim_templates(kube, desired)
        for name in desired.stale_quotas:
            try:
                kube.delete_resource_quota(desired.namespace, name)
            except NotFound:
                pass
        for name, data in sorted(desired.placements.items()):
            kube.apply_config_map(desired.namespace, name, data, labels=MANAGED_BY)
        for name in desired.stale_placements:
            try:
                kube.delete_config_map(desired.namespace, name)
            except NotFound:
                pass
        for node, labels in sorted(desired.node_labels.items()):
            try:
                kube.patch_node_labels(node, labels)
            except NotFound:
                if any(v is not None for v in labels.values()):
                    raise
                # a vanished node carries no label to remove
        for node, value in desired.node_taints.items():
            try:
                kube.set_node_taint(kube.get_node(node), DEDICATED_TAINT, value)
            except NotFound:
                pass  # a vanished node: nothing to taint
    if desired.cleaned_pools:
        _mark_deprovisioned(desired.cleaned_pools, cluster)
    return desired


def _mark_deprovisioned(pool_ids: list[int], cluster: Cluster) -> None:
    """Released pools cleaned up on `cluster`: their PoolCluster there is done, and a pool is done once
    every cluster it held units on is (a pool without PoolCluster rows is on this cluster only)."""
    now = timezone.now()
    PoolCluster.objects.filter(pool_id__in=pool_ids, cluster=cluster, deprovisioned_at__isnull=True).update(
        deprovisioned_at=now, error=""
    )
    pending = PoolCluster.objects.filter(pool=OuterRef("pk"), deprovisioned_at__isnull=True)
    GpuPool.objects.filter(pk__in=pool_ids, deprovisioned_at__isnull=True).exclude(Exists(pending)).update(
        deprovisioned_at=now
    )


def provision_pool(pool: GpuPool, *, task_id: str = "", client_factory=KubernetesClient.for_cluster) -> str:
    """Provision one pool (idempotent): reconcile its project on each of its clusters, then mark it active.

    Returns the pool's state afterwards. A pool not in provisioning, or claimed by another live run,
    is left alone. The claim (services.claim_provisioning) holds a lease that a heartbeat renews while
    Kubernetes is written; if this worker dies, services.sweep_provisioning() re-enqueues the pool once
    the lease runs out, and the next run re-applies everything (reconcile is idempotent).
    A Kubernetes error on any cluster marks the pool and its request failed with the error as reason
    (the cluster named when the pool has several; its PoolCluster keeps the error) (retry:
    services.retry_provisioning). If the pool was released while this ran, reconciling again removes
    what this run wrote.
    """
    token = task_id or f"local-{uuid.uuid4()}"
    if not services.claim_provisioning(pool, token=token, task_id=task_id):
        pool.refresh_from_db(fields=["state"])
        return pool.state
    crash_point("provisioning.claimed")
    clusters = pool.clusters()
    try:
        with Heartbeat(GpuPool.objects.filter(pk=pool.pk, state=PoolState.PROVISIONING, claimed_by=token[:64])):
            for cluster in clusters:
                _reconcile_part(pool, cluster, client_factory, done="provisioned_at")
        crash_point("provisioning.reconciled")
    except PartFailed as failed:
        logger.warning("provisioning pool %s failed on %s: %s", pool.pk, failed.cluster.name, failed.error)
        where = f" ({failed.cluster.name})" if len(clusters) > 1 else ""
        services.mark_failed(pool, f"Kubernetes{where}: {failed.error}")
        pool.refresh_from_db(fields=["state", "state_reason"])
        return pool.state
    if not services.mark_provisioned(pool):
        pool.refresh_from_db(fields=["state", "state_reason", "released_at"])
        if pool.state == PoolState.RELEASED:
            deprovision_pool(pool, client_factory=client_factory)
    return pool.state


def deprovision_pool(pool: GpuPool, *, client_factory=KubernetesClient.for_cluster) -> bool:
    """Undo a released pool in Kubernetes on each of its clusters not cleaned yet (idempotent). False (reason
    kept on the pool) on failure; the pool is deprovisioned once every cluster is (_mark_deprovisioned)."""
    if pool.released_at is None or pool.deprovisioned_at is not None:
        return pool.deprovisioned_at is not None
    done = set(pool.pool_clusters.filter(deprovisioned_at__isnull=False).values_list("cluster_id", flat=True))
    clusters = [c for c in pool.clusters() if c.pk not in done]
    try:
        for cluster in clusters:
            _reconcile_part(pool, cluster, client_factory)
    except PartFailed as failed:
        logger.warning("clean-up of released pool %s on %s failed: %s", pool.pk, failed.cluster.name, failed.error)
        where = f" on {failed.cluster.name}" if len(pool.clusters()) > 1 else ""
        reason = f"clean-up{where} failed, will retry: {failed.error}"
        GpuPool.objects.filter(pk=pool.pk).update(state_reason=reason[:2000])
        return False
    return True


class PartFailed(Exception):
    """Kubernetes refused one cluster of a pool's provisioning or clean-up (PoolCluster.error says so too)."""

    def __init__(self, cluster: Cluster, error: KubernetesError):
        super().__init__(f"{cluster.name}: {error}")
        self.cluster, self.error = cluster, error


def _reconcile_part(pool: GpuPool, cluster: Cluster, client_factory, *, done: str = "") -> None:
    """Reconcile the pool's project on one of its clusters and record the outcome on its PoolCluster:
    the error, or success (`done`, a timestamp field, set). Raises PartFailed on a Kubernetes error."""
    part = PoolCluster.objects.filter(pool=pool, cluster=cluster)
    try:
        reconcile(pool.project, cluster, client_factory=client_factory)
    except KubernetesError as exc:
        part.update(error=str(exc)[:2000])
        raise PartFailed(cluster, exc) from exc
    part.update(error="", **({done: timezone.now()} if done else {}))


def apply_claim_templates(kube: KubernetesClient, desired: Desired) -> dict[str, str]:
    """Make the namespace's gpuaas ResourceClaimTemplates exactly `desired.claim_templates` (one list, writes
    only what differs). A template is immutable: a different one is deleted and created again. Returns
    template name -> what was done, for each one changed."""
    namespace = desired.namespace
    selector = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
    existing = {
        (obj.get("metadata") or {}).get("name"): obj
        for obj in kube.list_resource_claim_templates(namespace, label_selector=selector)
    }
    changes: dict[str, str] = {}
    for name, template in sorted(desired.claim_templates.items()):
        have = existing.get(name)
        if have is not None and have.get("spec") == template.spec:
            continue
        if have is not None:
            _delete_template(kube, namespace, name)
        kube.create_resource_claim_template(namespace, name, template.spec, labels=template.labels)
        changes[name] = f"claim template {namespace}/{name} " + ("recreated" if have is None else "rewritten")
    for name, obj in sorted(existing.items()):
        if name not in desired.claim_templates and POOL_LABEL in ((obj.get("metadata") or {}).get("labels") or {}):
            _delete_template(kube, namespace, name)
            changes[name] = f"claim template {namespace}/{name} removed"
    return changes


def _delete_template(kube: KubernetesClient, namespace: str, name: str) -> None:
    try:
        kube.delete_resource_claim_template(namespace, name)
    except NotFound:
        pass


# --- Level-triggered reconcile of provisioned pools ----------------------------------------------


def repair_drift(project: Project, cluster: Cluster, kube: KubernetesClient, nodes: dict[str, Node]) -> list[str]:
    """Compare what the cluster holds for `project` with the database and re-apply only what drifted.

    Reads the namespace and each held pool's quota (`nodes` is the cluster's node list, read once by
    the caller); writes nothing when nothing drifted. Returns one line per repair. Clean-up of
    released pools stays with deprovisioning (the label removals it would do are checked here too).
    """
    desired = desired_state(project, cluster)
    repairs: list[str] = []
    try:
        meta = kube.get_namespace(desired.namespace).get("metadata") or {}
    except NotFound:
        meta = None
    namespace = dict(labels=MANAGED_BY, annotations=desired.annotations, node_selector=desired.node_selector)
    if meta is None:
        kube.ensure_namespace(desired.namespace, **namespace)
        repairs.append(f"namespace {desired.namespace} recreated")
    elif (
        (meta.get("annotations") or {}).get(NODE_SELECTOR_ANNOTATION) != desired.node_selector
        or any((meta.get("labels") or {}).get(k) != v for k, v in MANAGED_BY.items())
        or any((meta.get("annotations") or {}).get(k) != v for k, v in desired.annotations.items())
    ):
        kube.patch_namespace(desired.namespace, **namespace)
        repairs.append(f"namespace {desired.namespace}: node selector, tolerations and labels restored")
    rewritten: list[str] = []
    for name, hard in desired.quotas.items():
        try:
            current = (kube.get_resource_quota(desired.namespace, name).get("spec") or {}).get("hard") or {}
        except NotFound:
            current = None
        if current != hard:
            kube.apply_resource_quota(desired.namespace, name, hard, labels=MANAGED_BY)
            rewritten.append(name)
            repairs.append(f"quota {desired.namespace}/{name} " + ("recreated" if current is None else "restored"))
    for node, labels in sorted(desired.node_labels.items()):
        have = nodes.get(node)
        if have is None:
            continue  # a vanished node: discovery reports it, there is nothing to label
        wrong = {key: value for key, value in labels.items() if have.labels.get(key) != value}
        if wrong:
            kube.patch_node_labels(node, wrong)
            repairs.append(f"node {node}: labels {', '.join(sorted(wrong))} restored")
        if kube.set_node_taint(have, DEDICATED_TAINT, desired.node_taints.get(node)) is not None:
            repairs.append(f"node {node}: dedicated taint restored")
    templates = apply_claim_templates(kube, desired) if desired.dra else {}
    repairs.extend(templates.values())
    # A pool released while this ran must not keep the quota or claim template just rewritten for it.
    written = {name: desired.claim_templates[name].pool_id for name in templates if name in desired.claim_templates}
    released = set(
        GpuPool.objects.filter(
            pk__in=[int(n.removeprefix("gpuaas-")) for n in rewritten] + list(written.values()),
            released_at__isnull=False,
        ).values_list("pk", flat=True)
    )
    for pk in sorted(released & {int(n.removeprefix("gpuaas-")) for n in rewritten}):
        try:
            kube.delete_resource_quota(desired.namespace, f"gpuaas-{pk}")
        except NotFound:
            pass
    for name, pk in sorted(written.items()):
        if pk in released:
            _delete_template(kube, desired.namespace, name)
    return repairs


def reconcile_provisioned(*, client_factory=KubernetesClient.for_cluster) -> dict[str, int]:
    """Beat (every POOL_RECONCILE_INTERVAL_S): re-apply whatever drifted for every active pool.

    Level-triggered: after a restart, a deleted quota, a node re-registered without its labels or a
    namespace annotation edited by hand is put back within one period. Per cluster one node list,
    per project one namespace read and one read per held pool's quota; writes only on drift. Each
    repair is logged and written to the audit trail of the project's active requests on that
    cluster. A failing cluster is logged and skipped. Returns counts.
    """
    active = GpuPool.objects.filter(state=PoolState.ACTIVE, released_at__isnull=True)
    pairs = sorted(
        set(active.values_list("cluster_id", "project_id"))
        | set(PoolCluster.objects.filter(pool__in=active).values_list("cluster_id", "pool__project_id"))
    )
    result = {"clusters": 0, "projects": 0, "repaired": 0, "errors": 0}
    by_cluster: dict[int, list[int]] = defaultdict(list)
    for cluster_id, project_id in pairs:
        by_cluster[cluster_id].append(project_id)
    clusters = Cluster.objects.in_bulk(list(by_cluster))
    projects = Project.objects.in_bulk([p for _, p in pairs])
    for cluster_id, project_ids in by_cluster.items():
        cluster = clusters[cluster_id]
        try:
            with client_factory(cluster) as kube:
                nodes = {n.name: n for n in kube.list_nodes()}
                for project_id in project_ids:
                    repairs = repair_drift(projects[project_id], cluster, kube, nodes)
                    result["projects"] += 1
                    if repairs:
                        _record_repairs(projects[project_id], cluster, repairs)
                        result["repaired"] += len(repairs)
        except KubernetesError as exc:
            logger.warning("reconcile of cluster %s failed: %s", cluster.name, exc)
            result["errors"] += 1
            continue
        now = timezone.now()
        checked = GpuPool.objects.on_cluster(cluster).filter(state=PoolState.ACTIVE, released_at__isnull=True)
        checked.update(reconciled_at=now)
        PoolCluster.objects.filter(cluster=cluster, pool__in=checked).update(reconciled_at=now)
        result["clusters"] += 1
    return result


def _record_repairs(project: Project, cluster: Cluster, repairs: list[str]) -> None:
    now = timezone.now()
    reason = "reconcile repaired drift: " + "; ".join(repairs)
    logger.warning("project %s on cluster %s: %s", project.slug, cluster.name, reason)
    request_ids = (
        GpuPool.objects.on_cluster(cluster)
        .filter(project=project, state=PoolState.ACTIVE, released_at__isnull=True)
        .values_list("request_id", flat=True)
    )
    PoolRequestTransition.objects.bulk_create(
        PoolRequestTransition(request_id=rid, from_state="active", to_state="active", reason=reason[:4000], at=now)
        for rid in request_ids
    )

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
  project was not granted are listed with "0", so the project cannot take a neighbour's units;
- one ConfigMap `gpuaas-pool-<pool id>` per held pool in that namespace with the pool's scheduling
  (GpuPool.scheduling(): a node selector and the equivalent required node affinity on the pool's
  label and its tier's `gpuaas.io/tier`), for the team's pod specs; a released pool's is deleted.

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

from django.db.models import Q
from django.utils import timezone

from capacity.adapters.kubernetes import NODE_SELECTOR_ANNOTATION, KubernetesClient, KubernetesError, Node, NotFound
from capacity.models import Cluster, SpecAndCount
from gpuaas.leases import Heartbeat, crash_point
from tenancy.models import Project

from . import services
from .choices import PoolState
from .models import LABEL_PREFIX, Allocation, GpuPool, PoolRequestTransition

logger = logging.getLogger(__name__)

MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuaas"}
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")


def project_label(project: Project | int) -> str:
    pk = project if isinstance(project, int) else project.pk
    return f"{LABEL_PREFIX}project-{pk}"


def node_selector(project: Project) -> str:
    return f"{project_label(project)}=true"


def placement_name(pool_id: int) -> str:
    return f"gpuaas-pool-{pool_id}"


def placement_data(pool: GpuPool) -> dict[str, str]:
    """The pool's scheduling (node selector and node affinity on its pool and tier labels) as ConfigMap data."""
    scheduling = pool.scheduling()
    return {
        "tier": pool.tier,
        "nodeSelector.json": json.dumps(scheduling["nodeSelector"], sort_keys=True),
        "affinity.json": json.dumps(scheduling["affinity"], sort_keys=True),
    }


@dataclass
class Desired:
    """What the cluster should hold for one project: quotas to apply and delete, node labels to patch."""

    namespace: str
    node_selector: str
    quotas: dict[str, dict[str, str]] = field(default_factory=dict)
    stale_quotas: list[str] = field(default_factory=list)
    node_labels: dict[str, dict[str, str | None]] = field(default_factory=dict)
    cleaned_pools: list[int] = field(default_factory=list)
    placements: dict[str, dict[str, str]] = field(default_factory=dict)  # ConfigMap name -> data
    stale_placements: list[str] = field(default_factory=list)


def desired_state(project: Project, cluster: Cluster) -> Desired:
    """Compute what the cluster should hold for `project` from the database (three queries)."""
    pools = list(
        GpuPool.objects.filter(project=project, cluster=cluster).filter(
            Q(released_at__isnull=True) | Q(deprovisioned_at__isnull=True)
        )
    )
    held = {p.pk for p in pools if p.released_at is None}
    gone = [p.pk for p in pools if p.released_at is not None]
    desired = Desired(namespace=project.namespace, node_selector=node_selector(project), cleaned_pools=gone)

    touched: dict[int, set[str]] = defaultdict(set)  # every node a unit of the pool was ever on
    carrying: dict[int, set[str]] = defaultdict(set)  # nodes with a unit the pool still holds
    granted: Counter = Counter()
    rows = Allocation.objects.filter(pool_id__in=[p.pk for p in pools]).values_list(
        "pool_id", "gpu__node__name", "gpu__node_id", "resource_name", "released_at"
    )
    node_ids: set[int] = set()
    for pool_id, node_name, node_id, resource, released_at in rows:
        touched[pool_id].add(node_name)
        if pool_id in held and released_at is None:
            carrying[pool_id].add(node_name)
            granted[resource] += 1
            node_ids.add(node_id)

    offered = set(SpecAndCount.objects.filter(node_id__in=node_ids).values_list("resource_name", flat=True).distinct())
    hard = {f"requests.{r}": "0" for r in offered | {"nvidia.com/gpu"} if r.startswith(GPU_RESOURCE_PREFIXES)}
    hard.update({f"requests.{r}": str(n) for r, n in granted.items()})
    desired.quotas = {f"gpuaas-{pk}": dict(sorted(hard.items())) for pk in sorted(held)}
    desired.stale_quotas = [f"gpuaas-{pk}" for pk in gone]
    desired.placements = {placement_name(p.pk): placement_data(p) for p in pools if p.released_at is None}
    desired.stale_placements = [placement_name(pk) for pk in gone]

    # A unit released on its own (monitoring's idle release) takes its node out of the pool too.
    for pk in sorted(touched):
        for node in touched[pk]:
            desired.node_labels.setdefault(node, {})[f"{LABEL_PREFIX}pool-{pk}"] = (
                "true" if node in carrying[pk] else None
            )
    project_nodes = set().union(*carrying.values())
    for node, labels in desired.node_labels.items():
        labels[project_label(project)] = "true" if node in project_nodes else None
    return desired


def reconcile(project: Project, cluster: Cluster, *, client_factory=KubernetesClient.for_cluster) -> Desired:
    """Make `cluster` match the database for `project` (idempotent); raises KubernetesError.

    On success, released pools of the project on that cluster are marked deprovisioned.
    """
    desired = desired_state(project, cluster)
    with client_factory(cluster) as kube:
        kube.ensure_namespace(desired.namespace, labels=MANAGED_BY, node_selector=desired.node_selector)
        for name, hard in desired.quotas.items():
            kube.apply_resource_quota(desired.namespace, name, hard, labels=MANAGED_BY)
        crash_point("provisioning.quotas")  # fault suite: quotas written, node labels not yet
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
    if desired.cleaned_pools:
        GpuPool.objects.filter(pk__in=desired.cleaned_pools, deprovisioned_at__isnull=True).update(
            deprovisioned_at=timezone.now()
        )
    return desired


def provision_pool(pool: GpuPool, *, task_id: str = "", client_factory=KubernetesClient.for_cluster) -> str:
    """Provision one pool (idempotent): reconcile its project on its cluster, then mark it active.

    Returns the pool's state afterwards. A pool not in provisioning, or claimed by another live run,
    is left alone. The claim (services.claim_provisioning) holds a lease that a heartbeat renews while
    Kubernetes is written; if this worker dies, services.sweep_provisioning() re-enqueues the pool once
    the lease runs out, and the next run re-applies everything (reconcile is idempotent).
    A Kubernetes error marks the pool and its request failed with the error as reason (retry:
    services.retry_provisioning). If the pool was released while this ran, reconciling again removes
    what this run wrote.
    """
    token = task_id or f"local-{uuid.uuid4()}"
    if not services.claim_provisioning(pool, token=token, task_id=task_id):
        pool.refresh_from_db(fields=["state"])
        return pool.state
    crash_point("provisioning.claimed")
    try:
        with Heartbeat(GpuPool.objects.filter(pk=pool.pk, state=PoolState.PROVISIONING, claimed_by=token[:64])):
            reconcile(pool.project, pool.cluster, client_factory=client_factory)
        crash_point("provisioning.reconciled")
    except KubernetesError as exc:
        logger.warning("provisioning pool %s failed: %s", pool.pk, exc)
        services.mark_failed(pool, f"Kubernetes: {exc}")
        pool.refresh_from_db(fields=["state", "state_reason"])
        return pool.state
    if not services.mark_provisioned(pool):
        pool.refresh_from_db(fields=["state", "state_reason", "released_at"])
        if pool.state == PoolState.RELEASED:
            deprovision_pool(pool, client_factory=client_factory)
    return pool.state


def deprovision_pool(pool: GpuPool, *, client_factory=KubernetesClient.for_cluster) -> bool:
    """Undo a released pool in Kubernetes (idempotent). False (reason kept on the pool) on failure."""
    if pool.released_at is None or pool.deprovisioned_at is not None:
        return pool.deprovisioned_at is not None
    try:
        reconcile(pool.project, pool.cluster, client_factory=client_factory)
    except KubernetesError as exc:
        logger.warning("clean-up of released pool %s failed: %s", pool.pk, exc)
        GpuPool.objects.filter(pk=pool.pk).update(state_reason=f"clean-up failed, will retry: {exc}"[:2000])
        return False
    return True


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
    if meta is None:
        kube.ensure_namespace(desired.namespace, labels=MANAGED_BY, node_selector=desired.node_selector)
        repairs.append(f"namespace {desired.namespace} recreated")
    elif (meta.get("annotations") or {}).get(NODE_SELECTOR_ANNOTATION) != desired.node_selector or any(
        (meta.get("labels") or {}).get(k) != v for k, v in MANAGED_BY.items()
    ):
        kube.patch_namespace(desired.namespace, labels=MANAGED_BY, node_selector=desired.node_selector)
        repairs.append(f"namespace {desired.namespace}: node selector and labels restored")
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
    # A pool released while this ran must not keep the quota just rewritten for it.
    released = GpuPool.objects.filter(
        pk__in=[int(n.removeprefix("gpuaas-")) for n in rewritten], released_at__isnull=False
    ).values_list("pk", flat=True)
    for pk in released:
        try:
            kube.delete_resource_quota(desired.namespace, f"gpuaas-{pk}")
        except NotFound:
            pass
    return repairs


def reconcile_provisioned(*, client_factory=KubernetesClient.for_cluster) -> dict[str, int]:
    """Beat (every POOL_RECONCILE_INTERVAL_S): re-apply whatever drifted for every active pool.

    Level-triggered: after a restart, a deleted quota, a node re-registered without its labels or a
    namespace annotation edited by hand is put back within one period. Per cluster one node list,
    per project one namespace read and one read per held pool's quota; writes only on drift. Each
    repair is logged and written to the audit trail of the project's active requests on that
    cluster. A failing cluster is logged and skipped. Returns counts.
    """
    pairs = sorted(
        set(
            GpuPool.objects.filter(state=PoolState.ACTIVE, released_at__isnull=True).values_list(
                "cluster_id", "project_id"
            )
        )
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
        GpuPool.objects.filter(cluster=cluster, state=PoolState.ACTIVE, released_at__isnull=True).update(
            reconciled_at=timezone.now()
        )
        result["clusters"] += 1
    return result


def _record_repairs(project: Project, cluster: Cluster, repairs: list[str]) -> None:
    now = timezone.now()
    reason = "reconcile repaired drift: " + "; ".join(repairs)
    logger.warning("project %s on cluster %s: %s", project.slug, cluster.name, reason)
    request_ids = GpuPool.objects.filter(
        project=project, cluster=cluster, state=PoolState.ACTIVE, released_at__isnull=True
    ).values_list("request_id", flat=True)
    PoolRequestTransition.objects.bulk_create(
        PoolRequestTransition(request_id=rid, from_state="active", to_state="active", reason=reason[:4000], at=now)
        for rid in request_ids
    )

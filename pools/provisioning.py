"""Provisioning pools in Kubernetes, and undoing it after release.

What gpuaas writes, per (project, cluster), all through capacity/adapters/kubernetes.py:

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

`reconcile()` makes the cluster match the database and is idempotent: provisioning, retries and
clean-up after release all call it. Released pools lose their quota and pool label, and nodes
left with no unit of the project lose the project label; the namespace itself stays.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from django.db.models import Q
from django.utils import timezone

from capacity.adapters.kubernetes import KubernetesClient, KubernetesError, NotFound
from capacity.models import Cluster, SpecAndCount

from . import services
from .choices import PoolState
from .models import LABEL_PREFIX, Allocation, GpuPool, Project

logger = logging.getLogger(__name__)

MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuaas"}
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")


def project_label(project: Project | int) -> str:
    pk = project if isinstance(project, int) else project.pk
    return f"{LABEL_PREFIX}project-{pk}"


def node_selector(project: Project) -> str:
    return f"{project_label(project)}=true"


@dataclass
class Desired:
    """What the cluster should hold for one project: quotas to apply and delete, node labels to patch."""

    namespace: str
    node_selector: str
    quotas: dict[str, dict[str, str]] = field(default_factory=dict)
    stale_quotas: list[str] = field(default_factory=list)
    node_labels: dict[str, dict[str, str | None]] = field(default_factory=dict)
    cleaned_pools: list[int] = field(default_factory=list)


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
        for name in desired.stale_quotas:
            try:
                kube.delete_resource_quota(desired.namespace, name)
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

    Returns the pool's state afterwards. A pool not in provisioning is left alone. A Kubernetes error
    marks the pool and its request failed with the error as reason (retry: services.retry_provisioning).
    If the pool was released while this ran, reconciling again removes what this run wrote.
    """
    if not services.bump_attempts(pool, task_id=task_id):
        pool.refresh_from_db(fields=["state"])
        return pool.state
    try:
        reconcile(pool.project, pool.cluster, client_factory=client_factory)
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

"""Making a cluster match the database: reconcile() (idempotent), provisioning and clean-up of one pool across
its clusters, and the repair of drift found on the nodes."""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict

from django.db.models import Exists, OuterRef
from django.utils import timezone

from capacity.adapters.kubernetes import NODE_SELECTOR_ANNOTATION, KubernetesClient, KubernetesError, Node, NotFound
from capacity.models import Cluster
from core.leases import Heartbeat, crash_point
from tenancy.models import Project

from .. import services
from ..choices import PoolState
from ..models import GpuPool, PoolCluster, PoolRequestTransition
from .desired import (
    BORROWED_PRIORITY,
    BORROWED_PRIORITY_CLASS,
    BORROWING_LABEL,
    DEDICATED_TAINT,
    MANAGED_BY,
    POOL_LABEL,
    Desired,
    desired_state,
)

logger = logging.getLogger(__name__)


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

"""Tier placement owned by gpuaas: operators assign nodes to tiers, gpuaas writes `gpuaas.io/tier` and keeps it.

assign_tier() records the assignment and the node's tier at once (approval reads NodeCapacity.tier),
then writes the label after commit. reconcile_tier_labels() is level-triggered: it reads each
assigned node from the API server and patches the label where it drifted (someone edited it, the
node re-registered without it); the beat runs it every discovery period. Discovery keeps an
assigned node's tier even while the label still says otherwise.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from capacity.adapters import kubernetes as kube
from capacity.models import Cluster, NodeCapacity, TierAssignment

logger = logging.getLogger(__name__)

TIER_LABEL = "gpuaas.io/tier"


def assign_tier(node: NodeCapacity, tier: str, *, actor=None) -> TierAssignment:
    """Assign `node` to `tier` ("" = untiered) and queue the label write after commit. Idempotent."""
    user = actor if actor is not None and getattr(actor, "is_authenticated", False) else None
    with transaction.atomic():
        assignment, _ = TierAssignment.objects.update_or_create(
            node=node, defaults={"tier": tier, "assigned_by": user, "labelled_at": None, "last_error": ""}
        )
        NodeCapacity.objects.filter(pk=node.pk).update(tier=tier)
        node.tier = tier
        enqueue_tier_labels(node.cluster_id)
    return assignment


def unassign_tier(node: NodeCapacity) -> bool:
    """Stop owning the node's tier: the label stays as it is and discovery reads it again."""
    return TierAssignment.objects.filter(node=node).delete()[0] > 0


def assigned_tiers(cluster: Cluster | int) -> dict[str, str]:
    """{node name: assigned tier} of one cluster (one query): discovery keeps these over the labels."""
    rows = TierAssignment.objects.filter(node__cluster=cluster).values_list("node__name", "tier")
    return dict(rows)


def reconcile_tier_labels(cluster: Cluster, *, client_factory=kube.KubernetesClient.for_cluster) -> dict:
    """Make every assigned, present node of `cluster` carry its tier label. Idempotent.

    Returns {"in_step": n, "patched": [node names], "missing": [node names]}; a node the API server
    no longer has is reported, not an error. A Kubernetes error is recorded on the assignments and raised.
    """
    assignments = list(
        TierAssignment.objects.filter(node__cluster=cluster, node__gone_at__isnull=True)
        .select_related("node")
        .order_by("node__name")
    )
    result: dict = {"in_step": 0, "patched": [], "missing": []}
    if not assignments:
        return result
    now = timezone.now()
    try:
        with client_factory(cluster) as k:
            for assignment in assignments:
                name = assignment.node.name
                try:
                    have = (k.get_node(name).labels or {}).get(TIER_LABEL)
                except kube.NotFound:
                    result["missing"].append(name)
                    continue
                want = assignment.tier or None
                if have != want:
                    k.patch_node_labels(name, {TIER_LABEL: want})
                    result["patched"].append(name)
                else:
                    result["in_step"] += 1
    except kube.KubernetesError as exc:
        TierAssignment.objects.filter(pk__in=[a.pk for a in assignments]).update(last_error=str(exc)[:2000])
        raise
    done = [a.pk for a in assignments if a.node.name not in result["missing"]]
    TierAssignment.objects.filter(pk__in=done).update(labelled_at=now, last_error="")
    if result["patched"]:
        logger.info("tier labels restored on %s: %s", cluster.name, ", ".join(result["patched"]))
    return result


def enqueue_tier_labels(cluster_id: int) -> None:
    """Queue reconcile_tier_labels for one cluster after commit."""
    from capacity.tasks import reconcile_tier_labels_task  # cycle: capacity.tasks imports this module

    reconcile_tier_labels_task.delay_on_commit(cluster_id)

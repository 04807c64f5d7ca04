"""Approval's reads of free units that stop early (#28): capped counts per cluster, and picks tier by tier.

Approval used to count every free unit of the spec in the fleet (best fit needs each cluster's count) and to
rank every free unit of the chosen cluster (whole nodes and GPUs first: an EXISTS per unit, then a sort of them
all) to lock one: 0.7 s at 100,000 free units. Both reads here stop once they have what they need, walking
units in index order (node, GPU, placement), so their cost follows what they return and the nodes they skip,
not the number of free units. `candidates` are free units (MigInstance.objects.free() or
GpuCapacity.objects.free(), the one definition of availability) narrowed to a request's spec by the caller.
"""

from __future__ import annotations

from django.db.models import Case, Exists, IntegerField, OuterRef, Q, Subquery, Value, When

from .models import Allocation, Cluster, GpuCapacity, NodeCapacity

# Clusters are counted up to max(need, COUNT_CAP) free units each: enough for best fit among the clusters
# with fewer, and for every decision that needs exact counts below `need` (spanning clusters).
COUNT_CAP = 128
# GPUs whose units pick_mig_dedicated_first() locks from per query.
CHUNK = 32


class _CountRows(Subquery):
    """COUNT(*) of a (sliced) subquery's rows: a count that stops at the slice."""

    template = "(SELECT COUNT(*) FROM (%(subquery)s) capped)"
    output_field = IntegerField()


def capped_by_cluster(candidates, cluster: str, cap: int, cluster_id: int | None = None) -> dict[int, int]:
    """Free units per cluster id (clusters without any left out), each counted up to `cap`: a cluster shown
    with less than `cap` has exactly that many, one shown with `cap` has at least that many. `cluster`: the
    candidates' path to their cluster id ("gpu__node__cluster_id", "node__cluster_id"); `cluster_id`: count
    that cluster only. One query; per cluster it reads at most `cap` free units (and the held ones between)."""
    inner = candidates.filter(**{cluster: OuterRef("pk")}).order_by().values("pk")[:cap]
    clusters = Cluster.objects.order_by()
    if cluster_id is not None:
        clusters = clusters.filter(pk=cluster_id)
    return {pk: n for pk, n in clusters.annotate(n=_CountRows(inner)).values_list("pk", "n") if n}


def _probe(column: str, outer: str) -> Q:
    """`column` = the outer row's `outer`, written as a range so that PostgreSQL probes the index once per GPU
    instead of hashing every active allocation of the fleet (an equality EXISTS becomes a hashed SubPlan: 0.4 s
    over 200,000 allocations to rank 3,000 GPUs)."""
    return Q(**{f"{column}__gte": OuterRef(outer), f"{column}__lte": OuterRef(outer)})


def pick_mig_dedicated_first(locked, project_id: int, cluster_id: int, limit: int, chunk: int = CHUNK) -> list:
    """Up to `limit` MIG instances of `locked` (free candidates, locked with SKIP LOCKED) on one cluster, in the
    order pools/units/'s _dedicated_first ranks them: on nodes no other project holds anything on, then on
    GPUs no other project holds anything on, then by node, GPU and placement.

    The units of one GPU share their node's and GPU's rank, so the cluster's MIG GPUs are ranked instead (an
    index probe into the allocations per GPU and per node, no test of their units), and their units are then
    locked `chunk` GPUs at a time, in that order and by placement, until `limit` are had. The same units as
    ranking every free unit of the cluster (which tested every unit and sorted them all: 0.1 s at 10,000 free
    units), at the cost of the cluster's MIG GPUs and nodes and of the units of the first GPUs in rank order."""
    others = Allocation.objects.active().exclude(project_id=project_id).order_by()
    gpus = GpuCapacity.objects.filter(node__cluster_id=cluster_id, mig_mode_current=True).order_by()
    rows = list(
        gpus.annotate(shared=Exists(others.filter(_probe("gpu_id", "pk")))).values_list("pk", "node_id", "shared")
    )
    # A node's rank once per node, not once per GPU: a probe per node into its GPUs' allocations.
    nodes = NodeCapacity.objects.filter(pk__in={node for _, node, _ in rows}).order_by()
    node_shared = dict(
        nodes.annotate(shared=Exists(others.filter(_probe("gpu__node_id", "pk")))).values_list("pk", "shared")
    )
    ranked = [pk for _, _, _, pk in sorted((node_shared[node], shared, node, pk) for pk, node, shared in rows)]
    picked: list = []
    short = limit
    for start in range(0, len(ranked), chunk):
        gpus = ranked[start : start + chunk]
        position = Case(*(When(gpu_id=g, then=Value(i)) for i, g in enumerate(gpus)), output_field=IntegerField())
        picked += locked.filter(gpu_id__in=gpus).order_by(position, "placement_start")[:short]
        short = limit - len(picked)
        if not short:  # no further GPU's units are read
            return picked
    return picked

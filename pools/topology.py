"""Whole GPUs for multi-GPU work: all on one node, the best-fitting node first.

A training job that spans GPUs talks between them every step; across nodes that traffic leaves
NVLink/NVSwitch for the network, so a multi-GPU full-GPU request is never split over nodes while
one node can hold it. Of the nodes that can, the one with the fewest free GPUs left over is taken
(best fit keeps large free nodes for large requests); NVLink-connected GPUs are preferred where
discovery knows them (GpuCapacity has no NVLink facts yet: see docs/tiers.md).
"""

from __future__ import annotations

from django.db.models import Count

from capacity.choices import SpecKind

from .models import PoolRequest


def one_node(request: PoolRequest) -> bool:
    """Does the request need all its units on one node? Whole GPUs, more than one."""
    return request.spec_kind == SpecKind.FULL and request.count > 1


def free_by_node(candidates) -> dict[int, tuple[int, int]]:
    """{node id: (cluster id, free GPUs)} over a queryset of free whole GPUs (one query)."""
    rows = candidates.values("node_id", "node__cluster_id").annotate(n=Count("pk")).order_by()
    return {r["node_id"]: (r["node__cluster_id"], r["n"]) for r in rows}


def best_per_cluster(by_node: dict[int, tuple[int, int]]) -> dict[int, int]:
    """{cluster id: the most free GPUs on one of its nodes}."""
    best: dict[int, int] = {}
    for cluster_id, free in by_node.values():
        best[cluster_id] = max(best.get(cluster_id, 0), free)
    return best


def nodes_that_fit(by_node: dict[int, tuple[int, int]], cluster_id: int, need: int) -> list[int]:
    """Nodes of `cluster_id` with `need` free GPUs, best fit first (fewest spare, then id)."""
    fitting = [(free, node) for node, (cluster, free) in by_node.items() if cluster == cluster_id and free >= need]
    return [node for _, node in sorted(fitting)]


def what_would_fit(request: PoolRequest, free_candidates, all_gpus) -> dict:
    """When no node has `request.count` free GPUs: the node that would, once the fewest GPUs are released.

    `all_gpus` are the present whole GPUs the request could use if none were held; `free_candidates`
    those free now. Returns {"node", "gpus", "free", "to_release"} or, when no node is large enough,
    {"node": None, "largest": the most GPUs of that kind one node has}.
    """
    free = {node: n for node, (_, n) in free_by_node(free_candidates).items()}
    sizes = list(all_gpus.values("node_id", "node__name").annotate(n=Count("pk")).order_by("node_id"))
    fits = [
        (request.count - free.get(row["node_id"], 0), row["node_id"], row["node__name"], row["n"])
        for row in sizes
        if row["n"] >= request.count
    ]
    if not fits:
        return {"node": None, "largest": max((row["n"] for row in sizes), default=0)}
    to_release, node_id, name, gpus = min(fits)
    return {"node": name, "gpus": gpus, "free": free.get(node_id, 0), "to_release": to_release}


def placement(request: PoolRequest, node_names: list[str]) -> str:
    """What the pool says about where its units sit: one node for multi-GPU whole-GPU work."""
    if not one_node(request) or not node_names:
        return ""
    return f"{len(node_names)} whole GPUs on one node ({node_names[0]})"

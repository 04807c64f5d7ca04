"""Whole GPUs for multi-GPU work: all on one node, the best-fitting node first.

A training job that spans GPUs talks between them every step; across nodes that traffic leaves
NVLink/NVSwitch for the network, so a multi-GPU full-GPU request is never split over nodes while
one node can hold it. Of the nodes that can, the one with the fewest free GPUs left over is taken
(best fit keeps large free nodes for large requests). Nearby GPUs are preferred: discovery records
each GPU's NVLink group (GpuCapacity.nvlink_group, from NVML: all 8 GPUs of an HGX board behind NVSwitch,
bridged pairs of PCIe cards) and, from the PCIe common ancestor, its host-bridge and NUMA groups
(pcie_group, numa_group). Nodes where one NVLink group holds the request come first, then nodes where one
PCIe group does, then one NUMA node; on a node the GPUs are taken from the nearest group that holds them,
the one with the fewest left over.
"""

from __future__ import annotations

from django.db.models import Count

from capacity.choices import SpecKind

from ..models import PoolRequest


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


# The groups a GPU belongs to, nearest first: what a set of GPUs shares says how it talks.
LOCALITY = ("nvlink_group", "pcie_group", "numa_group")
NOWHERE = len(LOCALITY)  # rank of a set that shares no group


def group_set(gpus: list[tuple[int, int | None]], need: int) -> list[int]:
    """`need` GPU ids of one group, from one node's free GPUs as (id, group) in index order: the group with
    the fewest free GPUs left over (best fit), or [] when no group holds `need`."""
    groups: dict[int, list[int]] = {}
    for gpu_id, group in gpus:
        if group is not None:
            groups.setdefault(group, []).append(gpu_id)
    fitting = sorted((len(ids), group) for group, ids in groups.items() if len(ids) >= need)
    return groups[fitting[0][1]][:need] if fitting else []


def local_set(gpus: list[tuple], need: int) -> tuple[int, list[int]]:
    """(rank, ids): `need` GPUs of one node sharing the nearest group, from (id, *groups in LOCALITY order);
    rank 0 is one NVLink group, 1 one PCIe host bridge, 2 one NUMA node, NOWHERE (with []) none of them."""
    for rank in range(NOWHERE):
        ids = group_set([(gpu[0], gpu[1 + rank]) for gpu in gpus], need)
        if ids:
            return rank, ids
    return NOWHERE, []


def free_gpus(candidates) -> list[tuple]:
    """(node id, cluster id, GPU id, *groups in LOCALITY order) of each free whole GPU in `candidates`, in
    (node, index) order: one query from which approval picks the cluster, the node and the set
    (by_node, sets_on_nodes), instead of one query for each."""
    return list(candidates.order_by("node_id", "index").values_list("node_id", "node__cluster_id", "pk", *LOCALITY))


def by_node(gpus: list[tuple]) -> dict[int, tuple[int, int]]:
    """free_by_node's answer, {node id: (cluster id, free GPUs)}, from free_gpus rows."""
    counts: dict[int, tuple[int, int]] = {}
    for node, cluster, *_ in gpus:
        counts[node] = (cluster, counts.get(node, (cluster, 0))[1] + 1)
    return counts


def sets_on_nodes(gpus: list[tuple], node_ids: list[int], need: int) -> dict[int, tuple[int, list[int]]]:
    """{node id: its local_set for `need` GPUs} from free_gpus rows."""
    rows: dict[int, list[tuple]] = {node: [] for node in node_ids}
    for node, _, *gpu in gpus:
        if node in rows:
            rows[node].append(tuple(gpu))
    return {node: local_set(gpus_of_node, need) for node, gpus_of_node in rows.items()}


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


def placement(request: PoolRequest, node_names: list[str], localities: list[tuple] = ()) -> str:
    """What the pool says about where its units sit: one node for multi-GPU whole-GPU work, and how its GPUs
    talk (`localities`: the taken GPUs' groups in LOCALITY order). Nothing about NVLink when no GPU of
    the node has any."""
    if not one_node(request) or not node_names:
        return ""
    text = f"{len(node_names)} whole GPUs on one node ({node_names[0]})"
    shared = [len({g[rank] for g in localities}) == 1 and localities[0][rank] is not None for rank in range(NOWHERE)]
    if localities and shared[0]:
        return text + ", NVLink-connected"
    if any(g[0] is not None for g in localities):
        text += ", not all NVLink-connected"
    if localities and shared[1]:
        text += ", under one PCIe host bridge"
    elif localities and shared[2]:
        text += ", on one NUMA node"
    return text

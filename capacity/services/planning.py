"""Capacity planning: effective slots per tier of the fleet as it is and as proposed. Read-only.

- current_capacity_plan(): slots per tier of the discovered GPUs, each GPU as it is now: a MIG
  layout (tier 1 arithmetic, capacity.mig.tiers), time-slice replicas of its node (tier 3), or a
  whole GPU. GPUs with the same product and use are summed through tiers.capacity_plan.
- proposed_capacity_plan(): the same for a proposed layout or replica count on N GPUs.

Rebalancing, which weighs pools' demand against these GPUs, is operations.rebalancing.
"""

from __future__ import annotations

from collections import Counter

from capacity.mig import tiers
from capacity.mig.catalog import find_product
from capacity.models import GpuCapacity, MigInstance


def _merge_tiers(totals: dict, tiers_: dict) -> None:
    for tier, data in tiers_.items():
        into = totals.setdefault(tier, {"slots": 0, "by_spec": {}})
        into["slots"] += data["slots"]
        for spec, n in data["by_spec"].items():
            into["by_spec"][spec] = into["by_spec"].get(spec, 0) + n


def current_capacity_plan(*, cluster=None, node_group: str | None = None, nodes=None) -> dict:
    """Slots per tier of the present GPUs (optionally of one cluster, node group or node list)."""
    gpus = GpuCapacity.objects.present().select_related("node")
    if cluster is not None:
        gpus = gpus.filter(node__cluster=cluster)
    if node_group is not None:
        gpus = gpus.filter(node__node_group=node_group)
    if nodes is not None:
        gpus = gpus.filter(node__in=nodes)
    layouts: dict[int, list[str]] = {}
    for gpu_id, name in MigInstance.objects.active().filter(gpu__in=gpus).values_list("gpu_id", "profile__name"):
        layouts.setdefault(gpu_id, []).append(name)
    groups: Counter = Counter()
    for gpu in gpus.order_by("node_id", "index"):
        product = find_product(gpu.catalog_product or gpu.product)
        key_product = product.key if product else (gpu.catalog_product or gpu.product)
        if gpu.mig_mode_current and product is not None:
            groups[(key_product, tuple(sorted(layouts.get(gpu.pk, []))), None)] += 1
        elif gpu.node.timeslice_replicas > 1:
            groups[(key_product, None, gpu.node.timeslice_replicas)] += 1
        else:
            groups[(key_product, None, None)] += 1
    out_groups, totals = [], {}

    def order(item):  # by product, then MIG, time-sliced, whole; then layout
        (product, layout, replicas), _ = item
        return product, 0 if layout is not None else (1 if replicas else 2), layout or (), replicas or 0

    for (product, layout, replicas), count in sorted(groups.items(), key=order):
        if find_product(product) is None:  # a GPU without MIG: whole or time-sliced only
            result = _plain_plan(product, count, replicas)
        else:
            result = tiers.capacity_plan(
                product, count, layout=list(layout) if layout is not None else None, timeslice_replicas=replicas
            )
        out_groups.append(
            {
                "product": product,
                "gpus": count,
                "use": "mig" if layout is not None else ("timeslice" if replicas else "full"),
                "layout": list(layout) if layout is not None else None,
                "replicas": replicas,
                "tiers": result["tiers"],
            }
        )
        _merge_tiers(totals, result["tiers"])
    return {"gpus": sum(groups.values()), "groups": out_groups, "totals": totals}


def _plain_plan(product: str, gpus: int, replicas: int | None) -> dict:
    if replicas:
        return {
            "tiers": {
                tiers.TIER_TIMESLICE: {
                    "slots": gpus * replicas,
                    "replicas": replicas,
                    "by_spec": {product: gpus * replicas},
                }
            }
        }
    return {"tiers": {tiers.TIER_FULL: {"slots": gpus, "by_spec": {product: gpus}}}}


def proposed_capacity_plan(product: str, gpus: int, *, layout=None, timeslice_replicas: int | None = None) -> dict:
    """tiers.capacity_plan for a proposal; ValueError (with the validator's reason) if it is invalid."""
    return tiers.capacity_plan(product, gpus, layout=layout, timeslice_replicas=timeslice_replicas)

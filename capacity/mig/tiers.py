"""Slots per virtualisation tier: the seed's capacity arithmetic, made checkable.

The seed plans "in effective GPU fractions per tier": 8 x H100 split 4g.40gb + 3g.40gb give 16 MIG
inference slots (tier 1); the same 8 time-sliced 4 ways give 32 development slots (tier 3). Each
tier is an alternative use of the same GPUs, so one answer may list several. Tier 2 (staging) uses
the same MIG arithmetic as tier 1, so it is not computed separately. Keys match capacity.choices.Tier.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from .catalog import Product, get_product
from .layout import parse_layout, validate_layout

TIER_MIG = "1"
TIER_TIMESLICE = "3"
TIER_FULL = "full"


def capacity_plan(
    product: Product | str,
    gpus: int,
    layout: str | Iterable[str] | None = None,
    timeslice_replicas: int | None = None,
) -> dict:
    """Slots per tier for `gpus` GPUs of one product.

    `layout` (a per-GPU MIG layout such as "4g.40gb,3g.40gb") gives tier "1"; `timeslice_replicas`
    (the device plugin's replicas, 2 or more) gives tier "3"; with neither, the GPUs are whole
    ("full", training). An invalid layout raises ValueError carrying the validation reason.
    """
    product = product if isinstance(product, Product) else get_product(product)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise ValueError(f"gpus must be a whole number >= 0, not {gpus!r}")
    tiers: dict[str, dict] = {}
    placements = []
    if layout is not None:
        names = parse_layout(layout) if isinstance(layout, str) else list(layout)
        result = validate_layout(product, names)
        if not result.valid:
            raise ValueError(f"invalid layout for {product.key}: {result.reason}")
        placements = [p.to_dict() for p in result.placements]
        per_gpu = Counter(p.profile for p in result.placements)
        tiers[TIER_MIG] = {
            "slots": gpus * len(result.placements),
            "by_spec": {name: gpus * count for name, count in per_gpu.items()},
        }
    if timeslice_replicas is not None:
        if isinstance(timeslice_replicas, bool) or not isinstance(timeslice_replicas, int) or timeslice_replicas < 2:
            raise ValueError(f"timeslice replicas must be 2 or more (1 means not shared), not {timeslice_replicas!r}")
        tiers[TIER_TIMESLICE] = {
            "slots": gpus * timeslice_replicas,
            "replicas": timeslice_replicas,
            "by_spec": {product.key: gpus * timeslice_replicas},
        }
    if not tiers:
        tiers[TIER_FULL] = {"slots": gpus, "by_spec": {product.key: gpus}}
    return {"product": product.key, "gpus": gpus, "tiers": tiers, "layout": placements}

"""The share of a physical GPU a unit represents: the one definition billing and the dashboard use.

A MIG instance withholds its compute slices *and* its memory slices from everyone else, so it
represents the larger of the two fractions: max(compute slices / the product's (7; A30: 4), memory
slices / the product's (8; A30: 4)). Two 3g.40gb on an H100 fill all 8 memory slices, so each is
1/2 of the GPU (not 3/7), and a fully carved GPU adds up to one GPU. A whole GPU is 1; a time-slice
replica is 1 / the node's replicas (6 replicas of GPUs time-sliced 4x are 6/4 = 1.5 GPUs); a vGPU is
1 / its type's vGPUs per GPU. Pure functions, no Django.
"""

from __future__ import annotations

from fractions import Fraction

from ..vgpu import VGPU_TYPES
from .catalog import find_product

FULL, MIG, TIMESLICE, VGPU, MPS = "full", "mig", "timeslice", "vgpu", "mps"  # capacity.choices.SpecKind values
# Kinds whose unit is one of `replicas` shares of a GPU (time-slice or MPS replica, vGPU).
REPLICATED_KINDS = frozenset({TIMESLICE, MPS, VGPU})


def mig_share(product: str, profile_name: str, compute_slices: int | None = None) -> Fraction:
    """The fraction of a GPU a MIG profile withholds: max(compute share, memory share).

    A profile unknown to the catalog falls back to compute_slices / the product's compute slices
    (7 when the product is unknown too), which is the weight Allocation.compute_slices carries.
    """
    catalog_product = find_product(product) if product else None
    if catalog_product is not None:
        profile = catalog_product.by_name.get(profile_name) or catalog_product.by_name.get(
            profile_name.replace(".me", "+me")
        )
        if profile is not None:
            return max(
                Fraction(profile.compute_slices, catalog_product.compute_slices),
                Fraction(profile.memory_slices, catalog_product.memory_slices),
            )
    total = catalog_product.compute_slices if catalog_product is not None else 7
    slices = compute_slices if compute_slices else total
    return min(Fraction(1), Fraction(slices, total))


def unit_share(
    kind: str, product: str, profile_name: str = "", *, compute_slices: int | None = None, replicas: int = 1
) -> Fraction:
    """The fraction of a GPU one unit of `kind` (capacity.choices.SpecKind) represents."""
    if kind == MIG:
        return mig_share(product, profile_name, compute_slices)
    if kind in REPLICATED_KINDS:  # a vGPU: replicas = vGPUs per GPU of its type
        return Fraction(1, max(1, replicas))
    return Fraction(1)


def shares_per_gpu(kind: str, profile_name: str, node_replicas: int | None) -> int:
    """Into how many units one GPU is split for a held unit of `kind`: a vGPU type's vGPUs per GPU, else
    the node's time-slice replicas (NodeCapacity.timeslice_replicas; read only for time-slicing)."""
    if kind == VGPU:
        vgpu = VGPU_TYPES.get(profile_name)
        return vgpu.max_per_gpu if vgpu else 1
    return node_replicas or 1


def held_share(kind: str, product: str, profile_name: str, compute_slices: int | None, node_replicas: int | None):
    """The share of a GPU one held unit (a pools.Allocation) represents, from its own fields and its node's
    time-slice replicas: what billing charges and every screen counts."""
    replicas = shares_per_gpu(kind, profile_name, node_replicas)
    return unit_share(kind, product, profile_name, compute_slices=compute_slices, replicas=replicas)

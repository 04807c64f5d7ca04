"""From what a team declares to a spec: isolation, tier, product and MIG profile.

Teams declare isolation (or a tier), optionally a GPU product, and either a MIG profile or the
memory and compute they need; gpuaas maps that to the smallest MIG profile that fits (from the
catalog, capacity/mig/catalog.py) and to the tier that serves the isolation and workload type.

Memory is compared with a profile's nominal size, the number in its name (3g.40gb offers 40 GB):
that is what teams read in the catalog and in `nvidia-smi`, and the exact MiB differ by a few
percent between products and drivers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from capacity.choices import SpecKind, Tier
from capacity.mig.catalog import PRODUCTS, Product, Profile, find_product

from ..choices import Isolation, WorkloadType
from ..exceptions import SpecError

TIER_ISOLATION: dict[str, str] = {
    Tier.SLA_INFERENCE: Isolation.MIG,
    Tier.STAGING: Isolation.MIG,
    Tier.DEVELOPMENT: Isolation.TIMESLICE,
    Tier.TRAINING: Isolation.FULL,
}
ISOLATION_KIND: dict[str, str] = {
    Isolation.MIG: SpecKind.MIG,
    Isolation.FULL: SpecKind.FULL,
    Isolation.TIMESLICE: SpecKind.TIMESLICE,
    Isolation.MPS: SpecKind.MPS,  # a replica of an MPS node: capped per client, priced as its own share
}
_NOMINAL_GB = re.compile(r"\.(\d+)gb")


@dataclass(frozen=True)
class Spec:
    isolation: str
    tier: str
    spec_kind: str
    product: str  # catalog key ("H100-80GB"), another inventory product name, or "" (any)
    profile_name: str  # canonical MIG profile, "" unless MIG


def default_tier(isolation: str, workload_type: str) -> str:
    """The seed's layered strategy: SLA inference on MIG is tier 1, other MIG work tier 2,
    time-slicing tier 3, full GPUs the training tier."""
    if isolation == Isolation.MIG:
        return Tier.SLA_INFERENCE if workload_type == WorkloadType.INFERENCE else Tier.STAGING
    if isolation in (Isolation.TIMESLICE, Isolation.MPS):
        return Tier.DEVELOPMENT
    return Tier.TRAINING


def nominal_gb(profile: Profile) -> int:
    match = _NOMINAL_GB.search(profile.name)
    return int(match.group(1)) if match else profile.memory_mib // 1024


def smallest_profile(
    products: list[Product], memory_gib: int | None, compute_fraction: Decimal | float | None
) -> tuple[Product, Profile] | None:
    """The smallest profile (compute slices, then memory) with enough memory and compute, over `products`.

    Media-extension (+me) profiles are never chosen for a declared need: they exist for decoders.
    """
    best: tuple[tuple, Product, Profile] | None = None
    for product in products:
        for profile in product.profiles:
            if profile.has_media_extensions:
                continue
            if memory_gib and nominal_gb(profile) < memory_gib:
                continue
            if compute_fraction and Decimal(profile.compute_slices) / product.compute_slices < Decimal(
                str(compute_fraction)
            ):
                continue
            key = (profile.compute_slices, profile.memory_slices, profile.memory_mib, product.key)
            if best is None or key < best[0]:
                best = (key, product, profile)
    return None if best is None else (best[1], best[2])


def resolve(
    *,
    isolation: str = "",
    tier: str = "",
    workload_type: str = WorkloadType.INFERENCE,
    product: str = "",
    profile_name: str = "",
    memory_gib: int | None = None,
    compute_fraction: Decimal | float | None = None,
    inventory_products: set[str] | None = None,
    fleet_mig_products: list[str] | None = None,
) -> Spec:
    """Map declared needs to a Spec; SpecError names every field that cannot be satisfied.

    `inventory_products` are product names seen in the fleet (NVML and GFD names, catalog keys):
    full-GPU and time-slice requests may name a GPU the MIG catalog does not know. When a MIG need
    names no product, `fleet_mig_products` (catalog keys present in the fleet) are searched, or the
    whole catalog when the fleet has none.
    """
    errors: dict[str, str] = {}
    if tier and tier not in TIER_ISOLATION:
        errors["tier"] = f"Unknown tier {tier!r}; choose one of {', '.join(TIER_ISOLATION)}."
    if isolation and tier in TIER_ISOLATION and TIER_ISOLATION[tier] != isolation:
        errors["tier"] = f"Tier {tier} serves {TIER_ISOLATION[tier]} units, not {isolation}."
    isolation = isolation or TIER_ISOLATION.get(tier, Isolation.MIG)
    tier = tier or default_tier(isolation, workload_type)
    if memory_gib is not None and memory_gib < 1:
        errors["memory_gib"] = "Give at least 1 GiB."
    if compute_fraction is not None and not (0 < Decimal(str(compute_fraction)) <= 1):
        errors["compute_fraction"] = "Give a fraction of one GPU's compute, above 0 and at most 1."

    catalog_product = find_product(product) if product else None
    if product and catalog_product is None:
        if isolation == Isolation.MIG:
            errors["product"] = f"Unknown MIG-capable GPU product {product!r}; known: {', '.join(PRODUCTS)}."
        elif product not in (inventory_products or set()):
            known = sorted(set(PRODUCTS) | (inventory_products or set()))
            errors["product"] = f"Unknown GPU product {product!r}; known: {', '.join(known)}."
    product_name = catalog_product.key if catalog_product else product

    canonical_profile = ""
    if isolation != Isolation.MIG:
        if profile_name:
            errors["profile_name"] = "Only MIG requests name a profile; leave it empty for full or time-sliced GPUs."
    elif "product" not in errors:
        if profile_name:
            canonical_profile, product_name, error = _named_profile(profile_name, catalog_product)
            if error:
                errors["profile_name"] = error
        elif memory_gib or compute_fraction:
            if "memory_gib" not in errors and "compute_fraction" not in errors:
                if catalog_product:
                    candidates = [catalog_product]
                else:
                    candidates = [PRODUCTS[k] for k in (fleet_mig_products or []) if k in PRODUCTS]
                    candidates = candidates or list(PRODUCTS.values())
                found = smallest_profile(candidates, memory_gib, compute_fraction)
                if found is None:
                    where = catalog_product.key if catalog_product else "any product"
                    errors["memory_gib"] = f"No MIG profile of {where} offers that much; ask for full GPUs instead."
                else:
                    product_name, canonical_profile = found[0].key, found[1].name
        else:
            errors["profile_name"] = "Give a MIG profile, or the memory (and compute) you need."
    if errors:
        raise SpecError(errors)
    return Spec(isolation, tier, ISOLATION_KIND[isolation], product_name, canonical_profile)


def _named_profile(name: str, product: Product | None) -> tuple[str, str, str]:
    """(canonical profile, product key or "", error) for a profile named by the team."""
    if product is not None:
        try:
            return product.profile(name).name, product.key, ""
        except KeyError as exc:
            return "", product.key, exc.args[0]
    for candidate in PRODUCTS.values():
        try:
            return candidate.profile(name).name, "", ""
        except KeyError:
            continue
    return "", "", f"Unknown MIG profile {name!r}; profiles look like 3g.40gb (see the MIG catalog)."

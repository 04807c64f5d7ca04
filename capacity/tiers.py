"""Tier profile policy: which MIG profiles each tier carries, with the seed's recommendation as default.

The seed puts production inference with latency SLAs on MIG (tier 1) in large slices (its arithmetic:
8 x H100 at 4g/3g give 16 inference slots), staging on MIG or vGPU (tier 2) in any size, and
development on shared GPUs (tier 3): where a development node is MIG-partitioned, only the small
1g/2g slices belong there. Operators change this per tier (TierProfilePolicy, admin and API);
approval, matching and the MIG planner read it here.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q

from .choices import Tier
from .mig.catalog import find_product
from .models import TierProfilePolicy


@dataclass(frozen=True)
class Policy:
    min_compute_slices: int = 1
    max_compute_slices: int = 8

    def allows(self, compute_slices: int) -> bool:
        return self.min_compute_slices <= compute_slices <= self.max_compute_slices

    def label(self) -> str:
        if self.min_compute_slices <= 1 and self.max_compute_slices >= 8:
            return "every MIG profile"
        if self.max_compute_slices >= 8:
            return f"MIG profiles of {self.min_compute_slices}g and larger"
        sizes = "/".join(f"{n}g" for n in range(self.min_compute_slices, self.max_compute_slices + 1))
        return f"only {sizes} MIG profiles"


DEFAULT_POLICIES: dict[str, Policy] = {
    Tier.SLA_INFERENCE: Policy(min_compute_slices=3),
    Tier.STAGING: Policy(),
    Tier.DEVELOPMENT: Policy(max_compute_slices=2),
    Tier.TRAINING: Policy(),
    Tier.NONE: Policy(),
}


def policies() -> dict[str, Policy]:
    """Every tier's policy: the stored rows over the defaults (one query)."""
    found = dict(DEFAULT_POLICIES)
    for row in TierProfilePolicy.objects.all():
        found[row.tier] = Policy(row.min_compute_slices, row.max_compute_slices)
    return found


def compute_slices(product: str, profile_name: str) -> int | None:
    """A profile's compute slices: from the catalog, or the "<n>g" its name starts with (the same on every product)."""
    catalog_product = find_product(product) if product else None
    profile = catalog_product.by_name.get(profile_name) if catalog_product else None
    if profile is not None:
        return profile.compute_slices
    head = profile_name.split("g.", 1)[0]
    return int(head) if head.isdigit() else None


def profile_allowed(tier: str, product: str, profile_name: str, table: dict[str, Policy] | None = None) -> bool:
    """May a unit of `profile_name` live on a node of `tier`? Unknown profiles are not refused here."""
    slices = compute_slices(product, profile_name)
    if slices is None:
        return True
    return (table or DEFAULT_POLICIES).get(tier, Policy()).allows(slices)


def policy_label(tier: str, table: dict[str, Policy] | None = None) -> str:
    return (table or DEFAULT_POLICIES).get(tier, Policy()).label()


def allowed_profiles(tier: str, product: str, table: dict[str, Policy] | None = None) -> list[str]:
    """The profile names of `product` a node of `tier` may carry (for the planner)."""
    catalog_product = find_product(product)
    if catalog_product is None:
        return []
    policy = (table or DEFAULT_POLICIES).get(tier, Policy())
    return [p.name for p in catalog_product.profiles if policy.allows(p.compute_slices)]


def allowed_instances_q(table: dict[str, Policy] | None = None, prefix: str = "") -> Q:
    """MIG instances whose profile their node's tier allows, as one filter on MigInstance (`prefix` for joins)."""
    condition = Q()
    for tier, policy in (table if table is not None else policies()).items():
        if policy.min_compute_slices <= 1 and policy.max_compute_slices >= 8:
            continue
        condition &= ~Q(**{f"{prefix}gpu__node__tier": tier}) | Q(
            **{f"{prefix}profile__compute_slices__range": (policy.min_compute_slices, policy.max_compute_slices)}
        )
    return condition


def tiers_allowing(product: str, profile_name: str, table: dict[str, Policy] | None = None) -> list[str]:
    """The tiers whose nodes may carry `profile_name` (for the planners: GPUs of other tiers are left out)."""
    table = table if table is not None else policies()
    return [tier for tier in Tier.values if profile_allowed(tier, product, profile_name, table)]

"""Tier profile policy: which MIG profiles each tier carries, and the words every screen says it in.

The seed puts production inference with latency SLAs on MIG (tier 1) in large slices (its arithmetic:
8 x H100 at 4g/3g give 16 inference slots), staging on MIG or vGPU (tier 2) in any size, and
development on shared GPUs (tier 3): where a development node is MIG-partitioned, only the small
1g/2g slices belong there. Each tier's rule is a TierProfilePolicy row (the admin's "Tier profile
policies", the API's /capacity/tier-policies/); migration 0020 wrote the seed's recommendation
(DEFAULT_POLICIES) as those rows. A MIG instance its node's tier does not admit has availability
Availability.TIER_POLICY, shown everywhere as withheld_label() says; the planners read policies().
"""

from __future__ import annotations

from .choices import Availability, Tier
from .mig.catalog import find_product
from .models import TierProfilePolicy
from .models.tiers import DEFAULT_POLICIES, Policy

__all__ = [
    "DEFAULT_POLICIES",
    "Policy",
    "allowed_profiles",
    "availability_label",
    "compute_slices",
    "policies",
    "policy_label",
    "profile_allowed",
    "rule",
    "tiers_allowing",
    "withheld_label",
]


def policies() -> dict[str, Policy]:
    """Every tier's policy: its row, or the built-in default where the row is missing (one query)."""
    return TierProfilePolicy.objects.table()


def _policy(tier: str, table: dict[str, Policy] | None) -> Policy:
    return (table if table is not None else policies()).get(tier, Policy())


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
    return _policy(tier, table).allows(slices)


def policy_label(tier: str, table: dict[str, Policy] | None = None) -> str:
    """What the tier admits: "3g and larger"."""
    return _policy(tier, table).label()


def rule(tier: str, table: dict[str, Policy] | None = None) -> str:
    """The tier's rule in a sentence: "tier 1 takes 3g and larger"."""
    who = f"tier {tier} takes" if tier else "untiered nodes take"
    return f"{who} {policy_label(tier, table)}"


def withheld_label(tier: str, table: dict[str, Policy] | None = None) -> str:
    """A withheld unit, as every screen names it: "Withheld by tier policy (tier 1 takes 3g and larger)"."""
    return f"{Availability.TIER_POLICY.label} ({rule(tier, table)})"


def availability_label(availability: str, tier: str, table: dict[str, Policy] | None = None) -> str:
    """A unit's availability in words; withheld by the policy, with its node's tier's rule."""
    if availability == Availability.TIER_POLICY:
        return withheld_label(tier, table)
    return Availability(availability).label


def allowed_profiles(tier: str, product: str, table: dict[str, Policy] | None = None) -> list[str]:
    """The profile names of `product` a node of `tier` may carry (for the planner)."""
    catalog_product = find_product(product)
    if catalog_product is None:
        return []
    policy = _policy(tier, table)
    return [p.name for p in catalog_product.profiles if policy.allows(p.compute_slices)]


def tiers_allowing(product: str, profile_name: str, table: dict[str, Policy] | None = None) -> list[str]:
    """The tiers whose nodes may carry `profile_name` (for the planners: GPUs of other tiers are left out)."""
    table = table if table is not None else policies()
    return [tier for tier in Tier.values if profile_allowed(tier, product, profile_name, table)]

"""Price derivation: the rule that turns a full-GPU hourly price into MIG and time-slice prices.

Pure functions, no Django models: the default-card data migration, the rate-card service and the
meter all derive prices here, so they can never disagree.

The rule (docs/billing.md, "Rate derivation"):

- full GPU: the card's price for the product;
- MIG profile: full price x the profile's share of the GPU (capacity.mig.share.mig_share:
  max(compute share, memory share), the fraction of the GPU it withholds from everyone else; two
  3g.40gb on an H100 fill all 8 memory slices, so each costs 1/2, not 3/7, and a fully carved GPU
  earns its full price);
- time-slice replica: full price / replicas of that GPU;
- vGPU: full price / vGPUs per GPU of its type, plus the vGPU licence (BILLING_VGPU_LICENCE_HOURLY).

Derived prices are rounded once, to PRICE_PLACES, when they are written into a card: the stored
figure *is* the price. Every entry can be overridden by an operator.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

from django.conf import settings

from capacity.mig.catalog import PRODUCTS
from capacity.mig.share import mig_share  # the one GPU-share rule (billing.services uses unit_share)

PRICE_PLACES = Decimal("0.000001")
FULL, MIG, TIMESLICE, VGPU = "full", "mig", "timeslice", "vgpu"
# The seed: a vGPU runs 5-15% slower than bare metal (capacity.vgpu.OVERHEAD_RANGE_PCT); statements say so.
VGPU_OVERHEAD_NOTE = "5-15% slower than bare metal"


@dataclass(frozen=True)
class SpecKey:
    """What a price is for: (kind, product, MIG profile / vGPU type / "", replicas / vGPUs per GPU / 1)."""

    kind: str
    product: str
    profile_name: str = ""
    replicas: int = 1

    def label(self) -> str:
        if self.kind == MIG:
            return f"{self.product} {self.profile_name}"
        if self.kind == TIMESLICE:
            return f"{self.product} 1/{self.replicas} time-slice"
        if self.kind == VGPU:
            return f"{self.product} vGPU {self.profile_name} (1/{self.replicas} GPU + licence, {VGPU_OVERHEAD_NOTE})"
        return f"{self.product} full GPU"


def spec_key(kind: str, product: str, profile_name: str = "", replicas: int = 1) -> SpecKey:
    """Normalise a spec: only MIG and vGPU carry a profile (the vGPU type), only time-slicing and vGPU replicas."""
    return SpecKey(
        kind=kind,
        product=product,
        profile_name=profile_name if kind in (MIG, VGPU) else "",
        replicas=max(1, int(replicas or 1)) if kind in (TIMESLICE, VGPU) else 1,
    )


def spec_fields(key) -> dict:
    """The four spec columns (kind, product, profile_name, replicas) of a spec key, or of any row that has them."""
    return {"kind": key.kind, "product": key.product, "profile_name": key.profile_name, "replicas": key.replicas}


def quantize_price(value: Fraction | Decimal) -> Decimal:
    if isinstance(value, Fraction):
        value = Decimal(value.numerator) / Decimal(value.denominator)
    return value.quantize(PRICE_PLACES, rounding=ROUND_HALF_UP)


def derive_price(full_price: Decimal, key: SpecKey, *, compute_slices: int | None = None) -> Decimal:
    """The default hourly price of `key` given the product's full-GPU price (see the module docstring)."""
    full = Fraction(full_price)
    if key.kind == MIG:
        return quantize_price(full * mig_share(key.product, key.profile_name, compute_slices))
    if key.kind == TIMESLICE:
        return quantize_price(full / key.replicas)
    if key.kind == VGPU:
        return quantize_price(full / key.replicas + Fraction(settings.BILLING_VGPU_LICENCE_HOURLY))
    return quantize_price(full)


def default_entries(full_prices: dict[str, Decimal]) -> list[tuple[SpecKey, Decimal, str]]:
    """(spec, price, rule) for a card: each product's full GPU, and every MIG profile the catalog knows.

    Time-slice prices are derived when metered (replica counts are a node setting), unless a card
    carries an explicit time-slice entry.
    """
    entries: list[tuple[SpecKey, Decimal, str]] = []
    for product, price in sorted(full_prices.items()):
        full = quantize_price(Decimal(price))
        entries.append((spec_key(FULL, product), full, "full-GPU price"))
        catalog_product = PRODUCTS.get(product)
        if catalog_product is None:
            continue
        for profile in catalog_product.profiles:
            key = spec_key(MIG, product, profile.name)
            share = mig_share(product, profile.name)
            entries.append((key, derive_price(full, key), f"full x {share.numerator}/{share.denominator}"))
    return entries


def derivation_rule(key: SpecKey) -> str:
    """Human-readable rule for a derived price, e.g. "full x 1/2" or "full / 4"."""
    if key.kind == MIG:
        share = mig_share(key.product, key.profile_name)
        return f"full x {share.numerator}/{share.denominator}"
    if key.kind == TIMESLICE:
        return f"full / {key.replicas}"
    if key.kind == VGPU:
        return f"full / {key.replicas} + licence {settings.BILLING_VGPU_LICENCE_HOURLY}"
    return "full-GPU price"

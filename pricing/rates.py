"""Price derivation: the rule that turns a full-GPU hourly price into MIG and time-slice prices.

Pure functions, no Django models: the default-card data migration, the rate-card services, matching's
price lookup and billing's meter all derive prices here, so they can never disagree.

The rule (docs/billing.md, "Rate derivation"):

- full GPU: the card's price for the product;
- MIG profile: full price x the profile's share of the GPU (capacity.mig.share.mig_share:
  max(compute share, memory share), the fraction of the GPU it withholds from everyone else; two
  3g.40gb on an H100 fill all 8 memory slices, so each costs 1/2, not 3/7, and a fully carved GPU
  earns its full price);
- time-slice replica: full price / replicas of that GPU;
- MPS share: its own unit kind, full price / clients per GPU of that GPU by default (the MPS daemon caps each
  client at 1/replicas of memory and SMs, so a share withholds that much from the others); a card may carry
  an explicit MPS entry per product and replica count, priced apart from time-slices;
- vGPU: full price / vGPUs per GPU of its type, plus the card's vGPU licence per vGPU-hour
  (RateCard.vgpu_licence_hourly; BILLING_VGPU_LICENCE_HOURLY where no card is at hand). A card carries
  one entry per vGPU type of capacity.vgpu whose GPU it prices ("H100XM-20C"), so an operator can
  override one type's price.

Derived prices are rounded once, to PRICE_PLACES, when they are written into a card: the stored
figure *is* the price. Every entry can be overridden by an operator.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

from django.conf import settings

from capacity.mig.catalog import PRODUCTS
from capacity.mig.share import mig_share  # the one GPU-share rule (billing.services uses unit_share)
from capacity.vgpu import VGPU_TYPES

PRICE_PLACES = Decimal("0.000001")
# The default card's effective_from: the beginning of billing time (a never-delivered request's credit starts here).
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
FULL, MIG, TIMESLICE, VGPU, MPS = "full", "mig", "timeslice", "vgpu", "mps"
SHARED = (TIMESLICE, MPS)  # a replica of a node's shared GPU: priced per replica count
# The seed: a vGPU runs 5-15% slower than bare metal (capacity.vgpu.OVERHEAD_RANGE_PCT); statements say so.
VGPU_OVERHEAD_NOTE = "5-15% slower than bare metal"


@dataclass(frozen=True)
class SpecKey:
    """What a price is for: (kind, product, MIG profile / vGPU type / "", replicas / vGPUs per GPU / 1)."""

    kind: str
    product: str
    profile_name: str = ""
    replicas: int = 1

    def label(self, licence: Decimal | None = None) -> str:
        """What a statement line or an entry calls it; a vGPU says its type, licence (per hour, when known)
        and overhead."""
        if self.kind == MIG:
            return f"{self.product} {self.profile_name}"
        if self.kind == TIMESLICE:
            return f"{self.product} 1/{self.replicas} time-slice"
        if self.kind == MPS:
            return f"{self.product} 1/{self.replicas} MPS share"
        if self.kind == VGPU:
            fee = "licence" if licence is None else f"licence {Decimal(licence).normalize():f}/h"
            return f"{self.product} vGPU {self.profile_name} (1/{self.replicas} GPU + {fee}, {VGPU_OVERHEAD_NOTE})"
        return f"{self.product} full GPU"


def on_the_hour(when: datetime) -> bool:
    """Does `when` start a UTC hour? Prices change only there (a card's effective_from)."""
    return when.astimezone(UTC).replace(minute=0, second=0, microsecond=0) == when


def spec_key(kind: str, product: str, profile_name: str = "", replicas: int = 1) -> SpecKey:
    """Normalise a spec: only MIG and vGPU carry a profile (the vGPU type), only shared kinds (time-slice, MPS)
    and vGPU replicas."""
    return SpecKey(
        kind=kind,
        product=product,
        profile_name=profile_name if kind in (MIG, VGPU) else "",
        replicas=max(1, int(replicas or 1)) if kind in (*SHARED, VGPU) else 1,
    )


def spec_fields(key) -> dict:
    """The four spec columns (kind, product, profile_name, replicas) of a spec key, or of any row that has them."""
    return {"kind": key.kind, "product": key.product, "profile_name": key.profile_name, "replicas": key.replicas}


def quantize_price(value: Fraction | Decimal) -> Decimal:
    if isinstance(value, Fraction):
        value = Decimal(value.numerator) / Decimal(value.denominator)
    return value.quantize(PRICE_PLACES, rounding=ROUND_HALF_UP)


def licence_or_default(licence: Decimal | None) -> Decimal:
    """A card's vGPU licence per vGPU-hour, or the setting where no card is at hand."""
    return Decimal(settings.BILLING_VGPU_LICENCE_HOURLY) if licence is None else Decimal(licence)


def derive_price(
    full_price: Decimal, key: SpecKey, *, compute_slices: int | None = None, licence: Decimal | None = None
) -> Decimal:
    """The default hourly price of `key` given the product's full-GPU price (see the module docstring);
    `licence`: the card's vGPU licence per vGPU-hour."""
    full = Fraction(full_price)
    if key.kind == MIG:
        return quantize_price(full * mig_share(key.product, key.profile_name, compute_slices))
    if key.kind in SHARED:
        return quantize_price(full / key.replicas)
    if key.kind == VGPU:
        return quantize_price(full / key.replicas + Fraction(licence_or_default(licence)))
    return quantize_price(full)


def default_entries(
    full_prices: dict[str, Decimal], *, licence: Decimal | None = None
) -> list[tuple[SpecKey, Decimal, str]]:
    """(spec, price, rule) for a card: each product's full GPU, every MIG profile the catalog knows, and
    every vGPU type of that GPU (`licence`: the card's, per vGPU-hour).

    Time-slice and MPS prices are derived when metered (replica counts are a node setting), unless a card
    carries an explicit entry of that kind.
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
    for vgpu in sorted(VGPU_TYPES.values(), key=lambda t: (t.product, t.max_per_gpu, t.name)):
        if vgpu.product in full_prices:
            key = spec_key(VGPU, vgpu.product, vgpu.name, vgpu.max_per_gpu)
            price = derive_price(quantize_price(Decimal(full_prices[vgpu.product])), key, licence=licence)
            entries.append((key, price, derivation_rule(key, licence)))
    return entries


def derivation_rule(key: SpecKey, licence: Decimal | None = None) -> str:
    """Human-readable rule for a derived price, e.g. "full x 1/2", "full / 4" or "full / 4 + licence 0.05"."""
    if key.kind == MIG:
        share = mig_share(key.product, key.profile_name)
        return f"full x {share.numerator}/{share.denominator}"
    if key.kind in SHARED:
        return f"full / {key.replicas}"
    if key.kind == VGPU:
        return f"full / {key.replicas} + licence {licence_or_default(licence).normalize():f}"
    return "full-GPU price"

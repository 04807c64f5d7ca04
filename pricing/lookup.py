"""Hourly prices for matching's offers: the rate card in force now, read once per matching run.

Pools ranks offers by these (pools.units.offers passes price_lookup() to pools.units.matching.match); with no
card in force offers have no price, and matching ranks by the share of a GPU each withholds, which
the default rate derivation (pricing.rates) prices in proportion anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

from django.utils import timezone

from . import rates
from .models import RateCard

# (kind, product, profile_name, replicas) -> price of one unit for one hour, or None when unknown.
PriceLookup = Callable[[str, str, str, int], Decimal | None]


def no_price(kind: str, product: str, profile_name: str = "", replicas: int = 1) -> Decimal | None:
    return None


def price_lookup() -> PriceLookup:
    """One card read (entries prefetched); each offer is its entry, else derived from the product's full price."""
    card = RateCard.objects.effective_at(timezone.now())
    prices = card.price_map() if card is not None else {}
    licence = card.vgpu_licence_hourly if card is not None else None

    def lookup(kind: str, product: str, profile_name: str = "", replicas: int = 1) -> Decimal | None:
        key = rates.spec_key(kind, product, profile_name, replicas)
        if key in prices:
            return prices[key]
        full = prices.get(rates.spec_key(rates.FULL, product))
        return None if full is None else rates.derive_price(full, key, licence=licence)

    return lookup


def vgpu_price(full_price: Decimal, per_gpu: int) -> Decimal:
    """A vGPU's hour: its share of the GPU (1 / vGPUs per GPU) plus the vGPU licence (rates.derive_price)."""
    return rates.derive_price(full_price, rates.spec_key(rates.VGPU, "", "vgpu", per_gpu))

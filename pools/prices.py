"""Hourly prices for offers, supplied by the layer that owns rate cards.

Prices are billing's data and billing sits above pools, so pools does not read rate cards: the
billing app registers a factory at start-up (BillingConfig.ready(), billing/offers.py), as
monitoring registers the pool card's utilisation (pools/cards.py). The factory reads the card in
force once and returns a lookup for one matching run. Until one is registered offers have no price
and matching ranks by the share of a GPU each withholds, which the default rate derivation
(billing/rates.py) prices in proportion anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

# (kind, product, profile_name, replicas) -> price of one unit for one hour, or None when unknown.
PriceLookup = Callable[[str, str, str, int], Decimal | None]

_factory: Callable[[], PriceLookup] | None = None


def register_price_lookup(factory: Callable[[], PriceLookup] | None) -> None:
    global _factory
    _factory = factory


def no_price(kind: str, product: str, profile_name: str = "", replicas: int = 1) -> Decimal | None:
    return None


def price_lookup() -> PriceLookup:
    """A lookup over the rate card in force now (one or two queries), or no prices when none is registered."""
    return no_price if _factory is None else _factory()

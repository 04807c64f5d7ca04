"""Rate cards as billing sees them: pricing's card services, and the one rule that needs usage records.

Cards, their derivation and the PriceBook live in pricing (pricing.services); a card in force whose
hours billing has metered is never re-derived, which only billing can tell.
"""

from __future__ import annotations

from pricing import services as pricing
from pricing.models import RateCard


def rederive_card(card: RateCard) -> int:
    """pricing.services.rederive_card, refused (ValueError) for a card in force with metered usage:
    history is never repriced. Returns the number of entries written. Idempotent."""
    if card.in_force and card.usage_records.exists():
        raise ValueError(f"{card} is in force and has metered usage; add a new card instead")
    return pricing.rederive_card(card, unmetered=True)

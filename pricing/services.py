"""Rate cards: creating, copying and re-deriving them, and the in-memory PriceBook that prices metered hours.

The rate is the card in force at the start of each hour: prices change on hour boundaries.
Billing's metering prices hours through the PriceBook; billing.services re-exports these, and adds
the one rule that needs its usage records (a card in force whose hours are metered is never
re-derived, billing.services.rederive_card).
"""

from __future__ import annotations

import logging
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction

from capacity.choices import SpecKind

from . import rates
from .models import RateCard, RateCardEntry
from .rates import EPOCH

logger = logging.getLogger(__name__)


def default_full_prices() -> dict[str, Decimal]:
    return dict(settings.BILLING_DEFAULT_GPU_HOURLY)


@transaction.atomic
def create_rate_card(
    *,
    name: str,
    effective_from: datetime,
    full_prices: dict[str, Decimal],
    overrides: dict[rates.SpecKey, Decimal] | None = None,
    notes: str = "",
    vgpu_licence_hourly: Decimal | None = None,
    actor=None,
) -> RateCard:
    """A new card: full-GPU prices as given, every catalog MIG profile and vGPU type derived (vGPUs with the
    card's licence, `vgpu_licence_hourly` or BILLING_VGPU_LICENCE_HOURLY), `overrides` kept as set.

    effective_from must be a whole UTC hour (ValueError otherwise). Not idempotent: a second card at
    the same effective_from violates the unique constraint (IntegrityError).
    """
    if not rates.on_the_hour(effective_from):
        raise ValueError("effective_from must be a whole UTC hour")
    card = RateCard.objects.create(
        name=name,
        effective_from=effective_from,
        notes=notes,
        created_by=actor,
        vgpu_licence_hourly=rates.licence_or_default(vgpu_licence_hourly),
    )
    entries = {
        key: (price, rule, False)
        for key, price, rule in rates.default_entries(full_prices, licence=card.vgpu_licence_hourly)
    }
    for key, price in (overrides or {}).items():
        entries[key] = (rates.quantize_price(Decimal(price)), "override", True)
    RateCardEntry.objects.bulk_create(
        _entry(card, key, price, rule, is_override=is_override)
        for key, (price, rule, is_override) in sorted(entries.items(), key=lambda item: _key_order(item[0]))
    )
    return card


def _key_order(key: rates.SpecKey) -> tuple:
    return (key.product, key.kind, key.profile_name, key.replicas)


def _entry(
    card: RateCard, key: rates.SpecKey | RateCardEntry, price: Decimal, rule: str, *, is_override: bool = False
) -> RateCardEntry:
    """An unsaved entry of `card` pricing what `key` names (a spec key, or another card's entry)."""
    return RateCardEntry(card=card, **rates.spec_fields(key), hourly_price=price, rule=rule, is_override=is_override)


@transaction.atomic
def rederive_card(card: RateCard, *, unmetered: bool = False) -> int:
    """Recompute every derived (non-override) entry of `card` from its full-GPU entries and vGPU licence; add
    missing MIG and vGPU-type entries.

    Called after an operator edits a future card's full-GPU prices or licence. Refused (ValueError) for a card
    already in force, unless the caller vouches that none of its hours were metered (`unmetered`, what
    billing.services.rederive_card checks): history is never repriced. Returns the number of entries written.
    Idempotent.
    """
    if card.in_force and not unmetered:
        raise ValueError(f"{card} is in force (its hours may be metered); add a new card instead")
    entries = list(RateCardEntry.objects.select_for_update().filter(card=card).order_by("pk"))
    full = {e.product: e.hourly_price for e in entries if e.kind == SpecKind.FULL}
    by_key = {e.spec: e for e in entries}
    written = 0
    for key, price, rule in rates.default_entries(full, licence=card.vgpu_licence_hourly):
        entry = by_key.get(key)
        if entry is None:
            _entry(card, key, price, rule).save(force_insert=True)
            written += 1
        elif not entry.is_override and key.kind != SpecKind.FULL and (entry.hourly_price, entry.rule) != (price, rule):
            entry.hourly_price, entry.rule = price, rule
            entry.save(update_fields=["hourly_price", "rule"])
            written += 1
    for entry in entries:
        if entry.kind in rates.SHARED and not entry.is_override and entry.product in full:
            price = rates.derive_price(full[entry.product], entry.spec)
            if entry.hourly_price != price:
                entry.hourly_price, entry.rule = price, rates.derivation_rule(entry.spec)
                entry.save(update_fields=["hourly_price", "rule"])
                written += 1
    return written


@transaction.atomic
def copy_rate_card(card: RateCard, *, effective_from: datetime, name: str = "", actor=None) -> RateCard:
    """A new card with `card`'s entries (overrides kept as overrides), effective from a whole hour.

    The operator then edits the copy's full-GPU prices before it takes effect; derived entries
    follow through rederive_card(). Not idempotent (one card per effective_from).
    """
    if not rates.on_the_hour(effective_from):
        raise ValueError("effective_from must be a whole UTC hour")
    copy = RateCard.objects.create(
        name=name or f"{card.name} (copy)",
        effective_from=effective_from,
        notes=f"Copied from {card}.",
        off_peak_start_hour=card.off_peak_start_hour,
        off_peak_end_hour=card.off_peak_end_hour,
        off_peak_multiplier=card.off_peak_multiplier,
        borrowed_multiplier=card.borrowed_multiplier,
        vgpu_licence_hourly=card.vgpu_licence_hourly,
        created_by=actor,
    )
    RateCardEntry.objects.bulk_create(
        _entry(copy, e, e.hourly_price, e.rule, is_override=e.is_override) for e in card.entries.order_by("pk")
    )
    return copy


def seed_default_card(*, effective_from: datetime = EPOCH, name: str = "Default") -> tuple[RateCard, bool]:
    """The default card from BILLING_DEFAULT_GPU_HOURLY; (card, created). Idempotent: an existing card at
    `effective_from` is returned untouched."""
    existing = RateCard.objects.filter(effective_from=effective_from).first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():
            return (
                create_rate_card(
                    name=name,
                    effective_from=effective_from,
                    full_prices=default_full_prices(),
                    notes="Seeded from BILLING_DEFAULT_GPU_HOURLY.",
                ),
                True,
            )
    except IntegrityError:
        return RateCard.objects.get(effective_from=effective_from), False


class PriceBook:
    """Every rate card in memory, to price many hours without a query per hour."""

    def __init__(self):
        self.cards = list(RateCard.objects.order_by("effective_from").prefetch_related("entries"))
        self.maps = {card.pk: card.price_map() for card in self.cards}
        self._warned: set = set()

    def card_at(self, hour: datetime) -> RateCard | None:
        found = None
        for card in self.cards:
            if card.effective_from <= hour:
                found = card
            else:
                break
        return found

    def price(
        self, card: RateCard | None, key: rates.SpecKey, compute_slices: int | None, hour: datetime | None = None
    ) -> Decimal:
        """The hourly rate of `key` in `hour`: the card's price, times its off-peak multiplier in off-peak hours."""
        base = self.base_price(card, key, compute_slices)
        if card is None or hour is None or not card.is_off_peak(hour):
            return base
        return rates.quantize_price(base * card.off_peak_multiplier)

    def base_price(self, card: RateCard | None, key: rates.SpecKey, compute_slices: int | None) -> Decimal:
        """The card's entry for `key`; else derived from its full-GPU price; else 0 (logged once per spec)."""
        if card is None:
            return Decimal(0)
        prices = self.maps[card.pk]
        if key in prices:
            return prices[key]
        full = prices.get(rates.spec_key(SpecKind.FULL, key.product))
        if full is not None:
            derived = rates.derive_price(full, key, compute_slices=compute_slices, licence=card.vgpu_licence_hourly)
            prices[key] = derived
            return derived
        if (card.pk, key) not in self._warned:
            self._warned.add((card.pk, key))
            logger.warning(
                "rate card %s has no price for %s and no full-GPU price to derive one: metered at 0", card, key.label()
            )
        return Decimal(0)

"""pricing.services: re-deriving a card after an operator edits its full-GPU prices (what it writes and how many),
copying a card whole or not at all, seeding the default card once, and the price book's fallbacks."""

import logging
from decimal import Decimal
from unittest import mock

import pytest
from billing_helpers import at
from django.db import IntegrityError

from pricing import rates
from pricing import services as pricing
from pricing.models import RateCard, RateCardEntry
from pricing.services import PriceBook

pytestmark = pytest.mark.django_db

H100_3G = rates.spec_key("mig", "H100-80GB", "3g.40gb")
A100_3G = rates.spec_key("mig", "A100-80GB", "3g.40gb")
SLICE4 = rates.spec_key("timeslice", "H100-80GB", "", 4)
SLICE2 = rates.spec_key("timeslice", "H100-80GB", "", 2)


def _card(when="2030-03-01 00:00", **kw):
    return pricing.create_rate_card(
        name=f"card {when}",
        effective_from=at(when),
        full_prices={"H100-80GB": Decimal("3.00"), "A100-80GB": Decimal("2.00")},
        **kw,
    )


def _entry(card, key, price, *, override=False):
    return RateCardEntry.objects.create(
        card=card, **rates.spec_fields(key), hourly_price=price, rule="x", is_override=override
    )


def test_rederiving_an_unchanged_card_writes_nothing():
    card = _card()
    assert pricing.rederive_card(card) == 0


def test_rederiving_after_a_full_price_edit_rewrites_each_derived_entry_of_that_product_once():
    card = _card(overrides={rates.spec_key("mig", "H100-80GB", "1g.10gb"): Decimal("0.50")})
    _entry(card, SLICE4, Decimal("0.75"))  # a time-slice entry added later, derived
    _entry(card, SLICE2, Decimal("9.99"), override=True)  # and an operator's override
    h100 = RateCardEntry.objects.filter(card=card, product="H100-80GB")
    derived = h100.exclude(kind="full").filter(is_override=False).count()
    before = dict(RateCardEntry.objects.filter(card=card, product="A100-80GB").values_list("pk", "hourly_price"))
    h100.filter(kind="full").update(hourly_price=Decimal("4.00"))

    assert pricing.rederive_card(card) == derived

    prices = card.price_map()
    assert prices[H100_3G] == Decimal("2.000000")  # full x 1/2
    assert prices[SLICE4] == Decimal("1.000000") and prices[SLICE2] == Decimal("9.990000")
    assert prices[rates.spec_key("mig", "H100-80GB", "1g.10gb")] == Decimal("0.500000")
    assert prices[rates.spec_key("full", "H100-80GB")] == Decimal("4.000000")
    entry = RateCardEntry.objects.get(card=card, kind="timeslice", replicas=4)
    assert entry.rule == rates.derivation_rule(SLICE4)
    after = dict(RateCardEntry.objects.filter(card=card, product="A100-80GB").values_list("pk", "hourly_price"))
    assert after == before  # the other product's entries are left alone
    assert pricing.rederive_card(card) == 0
    h100.filter(kind="full").update(hourly_price=Decimal("2.00"))  # a price cut is followed as well
    assert pricing.rederive_card(card) == derived
    assert (card.price_map()[H100_3G], card.price_map()[SLICE4]) == (Decimal("1.000000"), Decimal("0.500000"))


def test_rederiving_adds_a_missing_derived_entry_back():
    card = _card()
    RateCardEntry.objects.filter(card=card, kind="mig", product="A100-80GB", profile_name="3g.40gb").delete()

    assert pricing.rederive_card(card) == 1
    assert card.price_map()[A100_3G] == Decimal("1.000000")


def test_a_card_in_force_is_rederived_only_when_the_caller_vouches_none_of_it_was_metered():
    card = _card(when="2020-01-01 00:00")
    with pytest.raises(ValueError, match="in force"):
        pricing.rederive_card(card)
    assert pricing.rederive_card(card, unmetered=True) == 0


def test_a_copy_carries_the_cards_terms_and_entries_or_nothing_at_all():
    card = _card(overrides={H100_3G: Decimal("1.11")})
    RateCard.objects.filter(pk=card.pk).update(
        off_peak_start_hour=22,
        off_peak_end_hour=6,
        off_peak_multiplier=Decimal("0.5"),
        borrowed_multiplier=Decimal("0.8"),
    )
    card.refresh_from_db()

    copy = pricing.copy_rate_card(card, effective_from=at("2030-04-01 00:00"))

    fields = ("off_peak_start_hour", "off_peak_end_hour", "off_peak_multiplier", "borrowed_multiplier")
    assert [getattr(copy, f) for f in fields] == [22, 6, Decimal("0.5"), Decimal("0.8")]
    assert copy.price_map() == card.price_map()
    assert RateCardEntry.objects.get(card=copy, kind="mig", product="H100-80GB", profile_name="3g.40gb").is_override
    with mock.patch.object(RateCardEntry.objects, "bulk_create", side_effect=RuntimeError("disk full")):
        with pytest.raises(RuntimeError):
            pricing.copy_rate_card(card, effective_from=at("2030-05-01 00:00"), name="half")
    assert not RateCard.objects.filter(name="half").exists()


def test_the_default_card_is_seeded_once():
    when = at("2031-01-01 00:00")  # (the suite's database already holds the default at the epoch)
    card, created = pricing.seed_default_card(effective_from=when, name="Later")
    again, created_again = pricing.seed_default_card(effective_from=when, name="Later")

    assert (created, created_again) == (True, False)
    assert again.pk == card.pk and RateCard.objects.filter(effective_from=when).count() == 1


def test_the_price_book_charges_nothing_without_a_card_or_a_price_and_says_so_once(caplog):
    card = _card(when="2020-01-01 00:00")
    book = PriceBook()
    unknown = rates.spec_key("full", "B200-192GB")

    assert book.base_price(None, H100_3G, 3) == Decimal(0)
    with caplog.at_level(logging.WARNING, logger="pricing.services"):
        assert book.base_price(card, unknown, 7) == Decimal(0)
        assert book.base_price(card, unknown, 7) == Decimal(0)
    assert [r.getMessage() for r in caplog.records].count(
        f"rate card {card} has no price for {unknown.label()} and no full-GPU price to derive one: metered at 0"
    ) == 1


def test_seeding_that_loses_a_race_returns_the_card_the_other_process_made():
    """Two processes seed at once: both find no card, one inserts first, the other's insert breaks the unique
    effective_from. The loser returns the winner's card, not created by it."""
    winner = RateCard.objects.get(effective_from=rates.EPOCH)  # the suite's database holds the default card
    none_yet = RateCard.objects.none()
    with (
        mock.patch.object(RateCard.objects, "filter", return_value=none_yet),
        mock.patch.object(pricing, "create_rate_card", side_effect=IntegrityError("duplicate key")),
    ):
        card, created = pricing.seed_default_card()

    assert (card.pk, created) == (winner.pk, False)

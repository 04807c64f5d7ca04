"""vGPU prices by type: a card carries one entry per vGPU type of the GPUs it prices (share + the card's
licence), an operator may override one type, and every price path (metering, offers) charges that entry."""

from decimal import Decimal

import pytest
from billing_helpers import at

from billing import services
from pricing import lookup, rates
from pricing.models import RateCard, RateCardEntry
from pricing.services import PriceBook

pytestmark = pytest.mark.django_db

XM20 = rates.spec_key("vgpu", "H100-80GB", "H100XM-20C", 4)


def _card(**kw):
    return services.create_rate_card(
        name="vGPU",
        effective_from=at("2030-03-01 00:00"),
        full_prices={"H100-80GB": Decimal("2.50")},
        vgpu_licence_hourly=Decimal("0.10"),
        **kw,
    )


def test_a_card_carries_an_entry_per_vgpu_type_with_its_licence():
    card = _card()
    entries = {e.spec: e for e in RateCardEntry.objects.filter(card=card, kind="vgpu")}
    assert (entries[XM20].hourly_price, entries[XM20].rule) == (Decimal("0.725000"), "full / 4 + licence 0.1")
    assert entries[rates.spec_key("vgpu", "H100-80GB", "H100-80C", 1)].hourly_price == Decimal("2.600000")
    assert entries[rates.spec_key("vgpu", "H100-80GB", "H100XM-4C", 20)].hourly_price == Decimal("0.225000")
    assert {key.product for key in entries} == {"H100-80GB"}  # no A100 types: the card prices no A100
    assert len(entries) == 16  # 8 sizes, PCIe (H100-*) and SXM5 (H100XM-*)


def test_rederive_follows_the_cards_licence_and_keeps_an_overridden_type():
    card = _card(overrides={rates.spec_key("vgpu", "H100-80GB", "H100XM-10C", 8): Decimal("0.20")})
    RateCard.objects.filter(pk=card.pk).update(vgpu_licence_hourly=Decimal("0.25"))
    card.refresh_from_db()
    services.rederive_card(card)
    prices = card.price_map()
    assert prices[XM20] == Decimal("0.875000")  # 2.50 / 4 + 0.25
    assert prices[rates.spec_key("vgpu", "H100-80GB", "H100XM-10C", 8)] == Decimal("0.200000")
    copy = services.copy_rate_card(card, effective_from=at("2030-04-01 00:00"))
    assert copy.vgpu_licence_hourly == Decimal("0.25")


def test_an_overridden_vgpu_type_is_what_metering_and_offers_charge():
    services.create_rate_card(
        name="now",
        effective_from=at("2020-01-01 00:00"),
        full_prices={"H100-80GB": Decimal("2.50")},
        overrides={XM20: Decimal("0.90")},
        vgpu_licence_hourly=Decimal("0.10"),
    )
    book = PriceBook()
    card = book.card_at(at("2026-06-01 10:00"))
    assert book.price(card, XM20, None, at("2026-06-01 10:00")) == Decimal("0.900000")
    price = lookup.price_lookup()
    assert price("vgpu", "H100-80GB", "H100XM-20C", 4) == Decimal("0.900000")
    assert price("vgpu", "H100-80GB", "H100XM-40C", 2) == Decimal("1.350000")  # the type's own entry
    # A type the card lacks is derived with the card's licence, not the setting's.
    book.maps[card.pk].pop(rates.spec_key("vgpu", "H100-80GB", "H100XM-8C", 10))
    assert book.price(card, rates.spec_key("vgpu", "H100-80GB", "H100XM-8C", 10), None) == Decimal("0.350000")


def test_the_vgpu_label_names_type_licence_and_overhead():
    assert XM20.label(Decimal("0.050000")) == (
        "H100-80GB vGPU H100XM-20C (1/4 GPU + licence 0.05/h, 5-15% slower than bare metal)"
    )


def test_a_vgpu_key_read_back_as_text_keeps_its_licence_rule():
    """The rule of a vGPU entry whose kind is text read from the database (equal to "vgpu", not the same object)."""
    kind = "".join(["v", "gpu"])  # built at run time: not the interned constant
    key = rates.spec_key(kind, "H100-80GB", "H100XM-20C", 4)
    assert rates.derivation_rule(key, Decimal("0.10")) == "full / 4 + licence 0.1"


def test_a_product_the_catalog_lacks_keeps_its_full_price_and_the_products_after_it_theirs():
    entries = {key: price for key, price, _ in rates.default_entries({"A-custom": "1.00", "H100-80GB": "2.50"})}
    assert entries[rates.spec_key("full", "A-custom")] == Decimal("1.000000")
    assert entries[rates.spec_key("full", "H100-80GB")] == Decimal("2.500000")
    assert entries[rates.spec_key("mig", "H100-80GB", "3g.40gb")] == Decimal("1.250000")

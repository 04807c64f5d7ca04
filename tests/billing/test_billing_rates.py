"""Rate derivation: MIG = full x max(compute share, memory share); time-slice = full / replicas; overrides win."""

from decimal import Decimal

import pytest
from billing_helpers import at

from billing import services
from pricing import rates
from pricing.models import RateCard, RateCardEntry

pytestmark = pytest.mark.django_db


def test_default_card_seeded_from_settings():
    card = RateCard.objects.get(effective_from=services.EPOCH)
    prices = card.price_map()
    assert card.currency == "EUR"
    assert prices[rates.spec_key("full", "H100-80GB")] == Decimal("2.500000")
    assert prices[rates.spec_key("full", "H200-141GB")] == Decimal("3.200000")
    assert prices[rates.spec_key("full", "A30-24GB")] == Decimal("0.600000")
    # 3g.40gb: 3/7 of the SMs but 4/8 of the memory -> half the GPU.
    assert prices[rates.spec_key("mig", "H100-80GB", "3g.40gb")] == Decimal("1.250000")
    # 4g.40gb: 4/7 compute beats 4/8 memory.
    assert prices[rates.spec_key("mig", "H100-80GB", "4g.40gb")] == Decimal("1.428571")
    # 1g.20gb: 1/7 compute, 2/8 memory -> a quarter.
    assert prices[rates.spec_key("mig", "H100-80GB", "1g.20gb")] == Decimal("0.625000")
    assert prices[rates.spec_key("mig", "H100-80GB", "1g.10gb")] == Decimal("0.357143")
    assert prices[rates.spec_key("mig", "H100-80GB", "7g.80gb")] == Decimal("2.500000")
    # A30 has 4 compute and 4 memory slices.
    assert prices[rates.spec_key("mig", "A30-24GB", "2g.12gb")] == Decimal("0.300000")
    entry = card.entries.get(kind="mig", product="H100-80GB", profile_name="3g.40gb")
    assert (entry.rule, entry.is_override) == ("full x 1/2", False)


def test_a_fully_carved_gpu_earns_its_full_price():
    for profile, count in (("3g.40gb", 2), ("1g.20gb", 4), ("1g.10gb", 7)):
        price = rates.derive_price(Decimal("2.80"), rates.spec_key("mig", "H100-80GB", profile))
        assert abs(price * count - Decimal("2.80")) <= Decimal("0.000004"), profile


def test_timeslice_price_is_full_price_over_replicas():
    assert rates.derive_price(Decimal("1.60"), rates.spec_key("timeslice", "A100-80GB", replicas=4)) == Decimal("0.4")


def test_unknown_profile_falls_back_to_compute_slices():
    key = rates.spec_key("mig", "H100-80GB", "9g.999gb")
    assert rates.derive_price(Decimal("7.00"), key, compute_slices=2) == Decimal("2.000000")


def test_override_kept_and_derived_entries_follow_full_price():
    card = services.create_rate_card(
        name="Spring",
        effective_from=at("2030-03-01 00:00"),
        full_prices={"H100-80GB": Decimal("3.00")},
        overrides={rates.spec_key("mig", "H100-80GB", "1g.10gb"): Decimal("0.50")},
    )
    RateCardEntry.objects.filter(card=card, kind="full", product="H100-80GB").update(hourly_price=Decimal("4.00"))
    services.rederive_card(card)
    prices = card.price_map()
    assert prices[rates.spec_key("mig", "H100-80GB", "3g.40gb")] == Decimal("2.000000")
    assert prices[rates.spec_key("mig", "H100-80GB", "1g.10gb")] == Decimal("0.500000")


def test_effective_from_must_be_a_whole_hour():
    with pytest.raises(ValueError, match="whole UTC hour"):
        services.create_rate_card(name="x", effective_from=at("2030-03-01 10:30"), full_prices={})
    assert not RateCard.objects.filter(name="x").exists()


def test_a_spec_key_normalises_what_it_is_given_and_equals_a_key_built_directly():
    """Prices are looked up by SpecKey: a key built directly (one unit, no replicas) must be the same dict key as
    the normalised one, and a missing, zero or negative replica count is one replica, never zero or less."""
    assert rates.SpecKey("mig", "H100-80GB", "3g.40gb") == rates.spec_key("mig", "H100-80GB", "3g.40gb")
    assert rates.SpecKey("full", "H100-80GB") == rates.spec_key("full", "H100-80GB", replicas=4)
    assert rates.SpecKey("full", "H100-80GB").replicas == 1
    assert rates.spec_key("timeslice", "H100-80GB").replicas == 1
    assert rates.spec_key("mps", "H100-80GB", replicas=0).replicas == 1
    assert rates.spec_key("timeslice", "H100-80GB", replicas=-2).replicas == 1
    assert rates.spec_key("vgpu", "H100-80GB", "H100XM-20C", replicas=-1).replicas == 1
    assert rates.spec_key("timeslice", "H100-80GB", replicas=4).replicas == 4

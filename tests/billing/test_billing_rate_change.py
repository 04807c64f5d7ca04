"""A new rate card applies from its (whole) hour: a mid-month change splits the month's lines by rate."""

from decimal import Decimal

import pytest
from billing_helpers import at, month

from billing import services
from billing.models import UsageRecord

pytestmark = pytest.mark.django_db


def test_rate_change_mid_month_splits_at_the_hour(project, allocate):
    card = services.create_rate_card(
        name="March increase", effective_from=at("2026-03-15 00:00"), full_prices={"H100-80GB": Decimal("3.00")}
    )
    allocate(project, "2026-03-14 22:30", "2026-03-15 02:00")

    services.meter_usage(now=at("2026-03-15 03:00"))
    statement = services.generate_statement(project, month("2026-03"))

    assert list(UsageRecord.objects.order_by("hour").values_list("hourly_rate", "rate_card")) == [
        (Decimal("2.500000"), services.PriceBook().card_at(at("2026-03-14 22:00")).pk),
        (Decimal("2.500000"), services.PriceBook().card_at(at("2026-03-14 23:00")).pk),
        (Decimal("3.000000"), card.pk),
        (Decimal("3.000000"), card.pk),
    ]
    lines = [(line.hourly_rate, line.hours, line.amount) for line in statement.lines.order_by("hourly_rate")]
    assert lines == [
        (Decimal("2.500000"), Decimal("1.5000"), Decimal("3.75")),
        (Decimal("3.000000"), Decimal("2.0000"), Decimal("6.00")),
    ]
    assert statement.total_amount == Decimal("9.75")


def test_derived_mig_prices_follow_the_new_card(project, allocate):
    services.create_rate_card(
        name="March increase", effective_from=at("2026-03-15 00:00"), full_prices={"H100-80GB": Decimal("3.00")}
    )
    allocate(project, "2026-03-14 23:00", "2026-03-15 01:00", kind="mig", profile="3g.40gb")

    services.meter_usage(now=at("2026-03-15 02:00"))

    assert list(UsageRecord.objects.order_by("hour").values_list("hourly_rate", flat=True)) == [
        Decimal("1.250000"),
        Decimal("1.500000"),
    ]


def test_a_card_in_force_is_rederived_only_while_none_of_its_hours_is_metered(project, other_project, allocate):
    """billing's rederive_card refuses a card in force whose hours were metered (history is never repriced) and
    leaves its entries as they were; a card in force that metered nothing yet is re-derived from its edited price."""
    from pricing import rates
    from pricing.models import RateCardEntry

    march = services.create_rate_card(
        name="March increase", effective_from=at("2026-03-15 00:00"), full_prices={"H100-80GB": Decimal("3.00")}
    )
    april = services.create_rate_card(
        name="April increase", effective_from=at("2026-04-01 00:00"), full_prices={"H100-80GB": Decimal("4.00")}
    )
    allocate(project, "2026-03-15 00:00", "2026-03-15 02:00")
    allocate(other_project, "2026-03-15 01:00", "2026-03-15 02:00", kind="mig", profile="3g.40gb")
    services.meter_usage(now=at("2026-03-15 03:00"))
    assert set(UsageRecord.objects.values_list("rate_card_id", flat=True)) == {march.pk}
    assert march.in_force and april.in_force and not april.usage_records.exists()
    RateCardEntry.objects.filter(kind="full", product="H100-80GB", card__in=[march, april]).update(
        hourly_price=Decimal("6.00")
    )
    mig = rates.spec_key("mig", "H100-80GB", "3g.40gb")

    with pytest.raises(ValueError, match="in force and has metered usage"):
        services.rederive_card(march)
    assert services.rederive_card(april) > 0

    assert march.price_map()[mig] == Decimal("1.500000")  # derived from 3.00, as metered
    assert april.price_map()[mig] == Decimal("3.000000")  # derived from the edited 6.00

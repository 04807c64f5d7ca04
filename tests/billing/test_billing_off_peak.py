"""Off-peak pricing: a rate card's time-of-day multiplier prices off-peak hours lower; statements split the lines."""

from decimal import Decimal

import pytest
from billing_helpers import at, month
from django.core.exceptions import ValidationError

from billing import services
from billing.models import UsageRecord
from pricing.models import RateCard

pytestmark = pytest.mark.django_db


def night_card(start=22, end=6, multiplier="0.600") -> None:
    """A card from March with an off-peak window (UTC hours) and multiplier."""
    card = services.create_rate_card(
        name="Night discount", effective_from=at("2026-03-01 00:00"), full_prices={"H100-80GB": Decimal("2.50")}
    )
    RateCard.objects.filter(pk=card.pk).update(
        off_peak_start_hour=start, off_peak_end_hour=end, off_peak_multiplier=Decimal(multiplier)
    )


def test_off_peak_hours_cost_less_and_the_statement_shows_the_split(project, allocate):
    night_card()
    allocate(project, "2026-03-10 20:00", "2026-03-11 00:30")  # 20, 21 peak; 22, 23, 00 (half) off-peak

    services.meter_usage(now=at("2026-03-11 01:00"))
    statement = services.generate_statement(project, month("2026-03"))

    assert list(UsageRecord.objects.order_by("hour").values_list("hourly_rate", flat=True)) == [
        Decimal("2.500000"),
        Decimal("2.500000"),
        Decimal("1.500000"),
        Decimal("1.500000"),
        Decimal("1.500000"),
    ]
    lines = [(line.description.split(": ", 1)[1], line.hours, line.amount) for line in statement.lines.order_by("pk")]
    assert sorted(lines) == [
        ("H100-80GB full GPU @ 1.5/h off-peak", Decimal("2.5000"), Decimal("3.75")),
        ("H100-80GB full GPU @ 2.5/h", Decimal("2.0000"), Decimal("5.00")),
    ]
    assert statement.total_amount == Decimal("8.75")


def test_a_daytime_window_and_a_card_without_one(project, allocate):
    night_card(start=9, end=12, multiplier="0.500")
    allocate(project, "2026-03-10 11:00", "2026-03-10 13:00")
    services.meter_usage(now=at("2026-03-10 14:00"))
    assert list(UsageRecord.objects.order_by("hour").values_list("hourly_rate", flat=True)) == [
        Decimal("1.250000"),
        Decimal("2.500000"),
    ]
    card = RateCard.objects.get(effective_from=at("2026-03-01 00:00"))
    copy = services.copy_rate_card(card, effective_from=at("2026-04-01 00:00"))
    assert (copy.off_peak_start_hour, copy.off_peak_end_hour, copy.off_peak_multiplier) == (9, 12, Decimal("0.500"))


def test_half_a_window_is_refused():
    card = RateCard(name="x", effective_from=at("2026-05-01 00:00"), off_peak_start_hour=22)
    with pytest.raises(ValidationError) as caught:
        card.clean()
    assert set(caught.value.message_dict) == {"off_peak_end_hour"}

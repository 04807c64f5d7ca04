"""Billing months as people type them: parse_period() takes "YYYY-MM" or the month's first day, and refuses
anything else with a message that says what is wrong (the statements API and `billing close` pass it on)."""

from datetime import UTC, date, datetime, timedelta

import pytest

from billing.periods import FIRST_PERIOD, LAST_PERIOD, overlap_seconds, parse_period


@pytest.mark.parametrize("text", ["2026-03", "2026-03-01", " 2026-03 ", "2026-03-01\n"])
def test_a_month_or_its_first_day_is_that_month(text):
    assert parse_period(text) == date(2026, 3, 1)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("2026-3", "is not a month"),  # six characters: not YYYY-MM, and not a date either
        ("2026-03-1x", "is not a month"),
        ("March 2026", "is not a month"),
        ("2026-13", "is not a month"),
        ("", "is not a month"),
        ("2026-03-02", "is not the first day of a month"),
        ("2026-03-31", "is not the first day of a month"),
        ("1969-12", "is out of range (1970-01 to 9998-12)"),
        ("9999-01", "is out of range (1970-01 to 9998-12)"),
    ],
)
def test_anything_else_is_refused_saying_why(text, says):
    with pytest.raises(ValueError) as refused:
        parse_period(text)
    assert says in str(refused.value)


def test_the_first_and_last_months_billing_can_close_are_accepted():
    assert parse_period("1970-01") == FIRST_PERIOD == date(1970, 1, 1)
    assert parse_period("9998-12") == LAST_PERIOD == date(9998, 12, 1)


def test_overlap_is_whole_seconds_of_the_intersection_and_zero_when_disjoint():
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    hour = timedelta(hours=1)
    assert overlap_seconds(t0, t0 + hour, t0 + hour / 2, t0 + 2 * hour) == 1800
    assert overlap_seconds(t0, t0 + hour, t0 + hour, t0 + 2 * hour) == 0  # touching ends share no second
    assert overlap_seconds(t0 + 2 * hour, t0 + 3 * hour, t0, t0 + hour) == 0
    assert overlap_seconds(t0, t0 + timedelta(seconds=1.9), t0, t0 + hour) == 1  # sub-second remainders truncate

"""UTC hours and calendar months: the two clocks billing runs on."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

HOUR = timedelta(hours=1)
# Months billing can reason about: month_bounds() needs the month after, which must exist (year <= 9999).
FIRST_PERIOD = date(1970, 1, 1)
LAST_PERIOD = date(9998, 12, 1)


def floor_hour(when: datetime) -> datetime:
    """The start of the UTC hour containing `when`."""
    return when.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def ceil_hour(when: datetime) -> datetime:
    floored = floor_hour(when)
    return floored if floored == when.astimezone(UTC) else floored + HOUR


def month_start(when: date | datetime) -> date:
    if isinstance(when, datetime):
        when = when.astimezone(UTC).date()
    return when.replace(day=1)


def next_month(period: date) -> date:
    return date(period.year + (period.month == 12), period.month % 12 + 1, 1)


def previous_month(period: date) -> date:
    return date(period.year - (period.month == 1), (period.month - 2) % 12 + 1, 1)


def month_bounds(period: date) -> tuple[datetime, datetime]:
    """[start, end) of the UTC calendar month containing `period`."""
    start = month_start(period)
    end = next_month(start)
    return (
        datetime(start.year, start.month, 1, tzinfo=UTC),
        datetime(end.year, end.month, 1, tzinfo=UTC),
    )


# What parse_period takes, as an OpenAPI schema: a month from FIRST_PERIOD to LAST_PERIOD, "YYYY-MM"
# or its first day "YYYY-MM-01".
PERIOD_SCHEMA = {
    "type": "string",
    "pattern": r"^(19[7-9]\d|[2-8]\d{3}|9[0-8]\d{2}|99[0-8]\d|999[0-8])-(0[1-9]|1[0-2])(-01)?$",
    "example": "2026-03",
}


def parse_period(text: str) -> date:
    """Parse a month: "2026-03" or "2026-03-01" -> date(2026, 3, 1); ValueError otherwise, and for
    months outside FIRST_PERIOD..LAST_PERIOD (9999-12 has no month after it to end at)."""
    text = text.strip()
    try:
        parsed = datetime.strptime(text, "%Y-%m" if len(text) == 7 else "%Y-%m-%d").date()
    except ValueError:
        raise ValueError(f"{text!r} is not a month (YYYY-MM)") from None
    if parsed.day != 1:
        raise ValueError(f"{text!r} is not the first day of a month")
    if not FIRST_PERIOD <= parsed <= LAST_PERIOD:
        raise ValueError(f"{text!r} is out of range ({FIRST_PERIOD:%Y-%m} to {LAST_PERIOD:%Y-%m})")
    return parsed


def overlap_seconds(a_start: datetime, a_end: datetime, b_start: datetime, b_end: datetime) -> int:
    """Whole seconds of [a_start, a_end) ∩ [b_start, b_end); 0 if disjoint. Truncates sub-second remainders."""
    start, end = max(a_start, b_start), min(a_end, b_end)
    return max(0, int((end - start).total_seconds())) if end > start else 0

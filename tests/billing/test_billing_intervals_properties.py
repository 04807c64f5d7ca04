"""Property-based tests (Hypothesis) of billing's interval and rate maths against a brute-force reference.

Every reference here walks time one second (or one day, or one hour) at a time and shares no code with billing:
where billing intersects, subtracts and merges [start, end) pairs, the reference counts the seconds that lie in
them. Times are drawn from random months of 1970-2099 (leap Februaries included; UTC has no DST), at any second,
so hours are partial; health, failed and trespass windows overlap each other and the clock at random.
"""

from __future__ import annotations

import calendar
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from billing.measurements import clip_windows
from billing.periods import ceil_hour, floor_hour, month_bounds, next_month, overlap_seconds, previous_month
from billing.services.clock import Unit, hour_figures
from billing.services.intervals import intersect, seconds_in, subtract
from billing.services.lines import lines_for
from pricing.models import RateCard

SPAN_S = 3 * 3600  # windows are drawn within three hours of a random second of a random month

months = st.builds(date, st.integers(1970, 2099), st.integers(1, 12), st.just(1))


@st.composite
def origins(draw) -> datetime:
    """A random second of a random month (any day, leap days included)."""
    period = draw(months)
    days = calendar.monthrange(period.year, period.month)[1]
    second = draw(st.integers(0, days * 86400 - 1))
    return datetime(period.year, period.month, 1, tzinfo=UTC) + timedelta(seconds=second)


def windows(origin: datetime, *, max_size: int = 4):
    """Lists of [start, end) pairs within SPAN_S of `origin`, overlapping at random (empty ones allowed)."""
    pair = st.tuples(st.integers(0, SPAN_S), st.integers(0, SPAN_S)).map(
        lambda p: (origin + timedelta(seconds=min(p)), origin + timedelta(seconds=max(p)))
    )
    return st.lists(pair, max_size=max_size)


def covered(intervals, origin: datetime) -> set[int]:
    """The reference: the seconds (offsets from `origin`) that lie in any of `intervals`, one by one."""
    out: set[int] = set()
    for start, end in intervals:
        out.update(range(int((start - origin).total_seconds()), int((end - origin).total_seconds())))
    return out


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_intersect_subtract_and_seconds_match_second_by_second_counting(data):
    origin = data.draw(origins())
    a, b = data.draw(windows(origin)), data.draw(windows(origin))
    a_disjoint = clip_windows(a, origin, origin + timedelta(seconds=SPAN_S))  # billing's own inputs never overlap

    assert seconds_in(a_disjoint) == len(covered(a, origin))
    both = intersect(a_disjoint, b)
    assert covered(both, origin) == covered(a, origin) & covered(b, origin)
    assert all(end > start for start, end in both)  # no empty pieces
    assert seconds_in(intersect(a_disjoint, clip_windows(b, origin, origin + timedelta(seconds=SPAN_S)))) == len(
        covered(a, origin) & covered(b, origin)
    )
    left = subtract(a_disjoint, b)
    assert covered(left, origin) == covered(a, origin) - covered(b, origin)
    assert seconds_in(left) == len(covered(a, origin) - covered(b, origin))
    assert all(end > start for start, end in left)  # no empty pieces


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_clip_windows_merges_overlapping_health_windows_like_counting_seconds(data):
    origin = data.draw(origins())
    raw = data.draw(windows(origin, max_size=6))
    open_ended = data.draw(st.lists(st.booleans(), min_size=len(raw), max_size=len(raw)))
    raw = [(a, None if is_open else b) for (a, b), is_open in zip(raw, open_ended, strict=True)]
    start = origin + timedelta(seconds=data.draw(st.integers(0, SPAN_S)))
    end = start + timedelta(seconds=data.draw(st.integers(0, SPAN_S)))

    merged = clip_windows(raw, start, end)

    expected = covered([(a, b or end) for a, b in raw], origin) & covered([(start, end)], origin)
    assert covered(merged, origin) == expected
    assert seconds_in(merged) == len(expected)  # disjoint: no second counted twice
    assert all(b > a for a, b in merged)
    assert all(merged[i][1] < merged[i + 1][0] for i in range(len(merged) - 1))  # sorted, touching ones merged


def _unit(start: datetime, stop: datetime | None) -> Unit:
    return Unit(
        id=7,
        project_id=3,
        pool_id=5,
        kind="full",
        product="H100-80GB",
        profile_name="",
        compute_slices=7,
        gpu_id=11,
        mig_instance_id=None,
        start=start,
        stop=stop,
        request_id=13,
        failed_now=False,
        replicas=1,
    )


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_hour_figures_credit_failed_then_health_never_twice(data):
    """Reserved, failed and health seconds of one unit in one hour, against a second-by-second walk of that hour:
    a second is reserved while the clock runs, failed-credited when also in a failed window, health-credited when
    in a health window and not failed-credited."""
    origin = data.draw(origins())
    hour = floor_hour(origin + timedelta(seconds=data.draw(st.integers(0, SPAN_S))))
    start = origin + timedelta(seconds=data.draw(st.integers(0, SPAN_S)))
    stop = data.draw(st.none() | st.integers(0, SPAN_S).map(lambda s: origin + timedelta(seconds=s)))
    stop = None if stop is None else max(stop, start)
    failed = clip_windows(data.draw(windows(origin)), origin, origin + timedelta(seconds=SPAN_S))
    health = clip_windows(data.draw(windows(origin)), origin, origin + timedelta(seconds=SPAN_S))

    figures = hour_figures(_unit(start, stop), hour, failed, health)

    reserved = failed_s = health_s = 0
    for offset in range(3600):
        second = hour + timedelta(seconds=offset)
        if not (start <= second and (stop is None or second < stop)):
            continue
        reserved += 1
        in_failed = any(a <= second < b for a, b in failed)
        failed_s += in_failed
        health_s += not in_failed and any(a <= second < b for a, b in health)
    assert (figures.seconds, figures.failed, figures.health) == (reserved, failed_s, health_s)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_unit_hours_are_the_hours_its_clock_ran_in(data):
    """The meter asks for the hours before a whole hour (`until`); a clock that ran no second (released the
    second it started) may name its own hour, which the meter drops (no seconds, no record)."""
    origin = data.draw(origins())
    start = origin + timedelta(seconds=data.draw(st.integers(0, SPAN_S)))
    stop = data.draw(st.none() | st.integers(0, 2 * SPAN_S).map(lambda s: start + timedelta(seconds=s)))
    until = floor_hour(start) + timedelta(hours=data.draw(st.integers(0, 6)))
    unit = _unit(start, stop)

    expected, second = [], start
    while second < until and (stop is None or second < stop):
        hour = second.replace(minute=0, second=0, microsecond=0)
        if not expected or expected[-1] != hour:
            expected.append(hour)
        second += timedelta(seconds=1)
    hours = unit.hours(until)
    assert [h for h in hours if seconds_in(unit.clock(h, h + timedelta(hours=1)))] == expected
    assert set(hours) - set(expected) <= ({floor_hour(start)} if stop == start else set())
    for hour in hours:
        ran = sum(1 for s in range(3600) if start <= hour + timedelta(seconds=s) < min(stop or until, until))
        assert seconds_in(unit.clock(hour, hour + timedelta(hours=1))) == ran


@settings(max_examples=80, deadline=None)
@given(period=months)
def test_month_bounds_count_the_days_of_the_month(period):
    """The reference walks day by day from the 1st until the month changes: 29 days in a leap February."""
    start, end = month_bounds(period)
    day, days = period, 0
    while day.month == period.month:
        days += 1
        day += timedelta(days=1)
    assert start == datetime(period.year, period.month, 1, tzinfo=UTC)
    assert end == datetime(day.year, day.month, 1, tzinfo=UTC)
    assert int((end - start).total_seconds()) == days * 86400
    if period.month == 2:
        assert days == (29 if calendar.isleap(period.year) else 28)
    assert next_month(period) == day
    assert previous_month(next_month(period)) == period
    assert next_month(previous_month(period)) == period


@settings(max_examples=80, deadline=None)
@given(when=origins())
def test_floor_and_ceil_hour_walk_to_the_hour(when):
    floor = when
    while floor.minute or floor.second:
        floor -= timedelta(seconds=1)
    ceil = when
    while ceil.minute or ceil.second:
        ceil += timedelta(seconds=1)
    assert floor_hour(when) == floor
    assert ceil_hour(when) == ceil


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_overlap_seconds_counts_the_shared_seconds(data):
    origin = data.draw(origins())
    (a0, a1), (b0, b1) = data.draw(windows(origin, max_size=2).filter(lambda w: len(w) == 2))
    assert overlap_seconds(a0, a1, b0, b1) == len(covered([(a0, a1)], origin) & covered([(b0, b1)], origin))


@settings(max_examples=120, deadline=None)
@given(
    start=st.integers(0, 23),
    end=st.integers(0, 23),
    when=origins(),
)
def test_off_peak_hours_are_the_hours_from_start_round_the_clock_to_end(start, end, when):
    """The reference walks the clock from the start hour to the end hour (past midnight when it must)."""
    card = RateCard(off_peak_start_hour=start, off_peak_end_hour=end, off_peak_multiplier=Decimal("0.5"))
    window, hour = set(), start
    while hour != end:
        window.add(hour)
        hour = (hour + 1) % 24
    assert card.is_off_peak(floor_hour(when)) == (when.hour in window)
    assert card.multiplier_at(floor_hour(when)) == (Decimal("0.5") if when.hour in window else Decimal(1))


def _half_up(value: Fraction, places: int) -> Decimal:
    """Round a Fraction half up to `places` decimals, in integer arithmetic."""
    scaled = value * 10**places
    whole = scaled.numerator // scaled.denominator
    if scaled - whole >= Fraction(1, 2):
        whole += 1
    return Decimal(whole).scaleb(-places)


@settings(max_examples=80, deadline=None)
@given(
    rate=st.decimals(min_value=Decimal("0.000001"), max_value=Decimal("99.999999"), places=6),
    seconds=st.integers(1, 31 * 86400),
    failed=st.integers(0, 31 * 86400),
    health=st.integers(0, 31 * 86400),
)
def test_line_amounts_are_the_rate_charged_second_by_second(rate, seconds, failed, health):
    """A usage line charges rate/3600 for every reserved second, credits the same per failed or health second,
    and rounds once, half up, to the cent (hours to 4 places). The reference adds rate/3600 once per second."""
    failed, health = min(failed, seconds), min(health, seconds - min(failed, seconds))
    row = {
        "project_id": 1,
        "pool_id": 2,
        "kind": "full",
        "product": "H100-80GB",
        "profile_name": "",
        "replicas": 1,
        "hourly_rate": rate,
        "off_peak": False,
        "vgpu_licence": None,
        "usage_period": None,
        "total_seconds": seconds,
        "measured_seconds": 0,
        "sm_seconds": None,
        "energy": None,
        "failed_seconds": failed,
        "health_seconds": health,
    }

    lines = {line.line_type: line for line in lines_for(None, row, "pool")}

    per_second = Fraction(rate) / 3600
    assert lines["usage"].amount == _half_up(per_second * seconds, 2)
    assert lines["usage"].hours == _half_up(Fraction(seconds, 3600), 4)
    assert lines["usage"].unmeasured_amount == lines["usage"].amount  # nothing measured
    if failed:
        assert lines["failed_credit"].amount == -_half_up(per_second * failed, 2)
    else:
        assert "failed_credit" not in lines
    if health:
        assert lines["health_credit"].amount == -_half_up(per_second * health, 2)
    else:
        assert "health_credit" not in lines
    assert all(line.amount.as_tuple().exponent == -2 for line in lines.values())
    assert _half_up(Fraction(1, 200), 2) == Decimal("0.01") == Decimal("0.005").quantize(Decimal("0.01"), ROUND_HALF_UP)


@settings(max_examples=60, deadline=None)
@given(
    full=st.decimals(min_value=Decimal("0.01"), max_value=Decimal("99.99"), places=2),
    replicas=st.integers(1, 16),
    licence=st.decimals(min_value=Decimal("0"), max_value=Decimal("1"), places=4),
)
def test_derived_prices_split_the_full_gpu_price_by_its_shares(full, replicas, licence):
    """A full GPU costs its price (no licence), a time-slice replica 1/replicas of it, a vGPU 1/vGPUs plus the
    licence: the reference is exact Fraction arithmetic rounded half up to 6 places."""
    from pricing.rates import derive_price, spec_key

    assert derive_price(full, spec_key("full", "H100-80GB"), licence=licence) == _half_up(Fraction(full), 6)
    timeslice = spec_key("timeslice", "H100-80GB", replicas=replicas)
    assert derive_price(full, timeslice) == _half_up(Fraction(full) / replicas, 6)
    vgpu = spec_key("vgpu", "H100-80GB", "H100XM-20C", replicas)
    assert derive_price(full, vgpu, licence=licence) == _half_up(Fraction(full) / replicas + Fraction(licence), 6)

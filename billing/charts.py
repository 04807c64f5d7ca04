"""The admin's daily cost chart of a statement: the read (reserved and used cost per day) and its inline SVG."""

from __future__ import annotations

from datetime import UTC, date
from decimal import Decimal

from django.db.models import ExpressionWrapper, F, IntegerField, Sum
from django.db.models.functions import TruncDate
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from .models import HOUR_S, UsageRecord
from .periods import month_bounds
from .services.lines import MONEY, as_decimal


def daily_costs(project_id: int, period: date) -> list[dict]:
    """Per day of the month: reserved and used cost (unrounded sums / 3600), for the admin chart."""
    start, end = month_bounds(period)
    rows = (
        UsageRecord.objects.filter(project_id=project_id, hour__gte=start, hour__lt=end)
        .annotate(day=TruncDate("hour", tzinfo=UTC))
        .values("day")
        .annotate(
            reserved=Sum(ExpressionWrapper(F("hourly_rate") * F("seconds"), output_field=MONEY)),
            used=Sum(ExpressionWrapper(F("hourly_rate") * F("seconds") * F("sm_activity"), output_field=MONEY)),
            seconds=Sum("seconds", output_field=IntegerField()),
        )
        .order_by("day")
    )
    return [
        {
            "day": row["day"],
            "reserved": as_decimal(row["reserved"]) / HOUR_S,
            "used": None if row["used"] is None else as_decimal(row["used"]) / HOUR_S,
        }
        for row in rows
    ]


def daily_chart_svg(days: list[dict], currency: str, *, width: int = 720, height: int = 160) -> str:
    """Inline SVG bars: reserved cost per day (light) with the used part (dark) over it. No scripts, no CDN."""
    if not days:
        return "No usage this month."
    top = max((d["reserved"] for d in days), default=Decimal(0)) or Decimal(1)
    bar = width / max(len(days), 1)
    scale = Decimal(height - 20) / top
    bars = []
    for i, d in enumerate(days):
        x = i * bar
        reserved_h = float(d["reserved"] * scale)
        used_h = float((d["used"] or 0) * scale)
        title = f"{d['day']:%Y-%m-%d}: reserved {d['reserved']:.2f}"
        title += f", used {d['used']:.2f}" if d["used"] is not None else ", used not measured"
        bars.append(
            (
                f"{x + 1:.1f}",
                f"{height - 14 - reserved_h:.1f}",
                f"{max(bar - 2, 1):.1f}",
                f"{reserved_h:.1f}",
                f"{height - 14 - used_h:.1f}",
                f"{used_h:.1f}",
                title,
                f"{x + bar / 2:.1f}",
                f"{d['day']:%d}",
            )
        )
    body = format_html_join(
        "",
        '<g><title>{6}</title><rect x="{0}" y="{1}" width="{2}" height="{3}" fill="#9ec5e8"></rect>'
        '<rect x="{0}" y="{4}" width="{2}" height="{5}" fill="#1f6fb2"></rect>'
        '<text x="{7}" y="158" font-size="9" text-anchor="middle">{8}</text></g>',
        bars,
    )
    legend = format_html(
        '<text x="4" y="10" font-size="10">max {} {} / day; light = reserved, dark = used</text>',
        f"{top:.2f}",
        currency,
    )
    return mark_safe(
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">{legend}{body}</svg>'
    )

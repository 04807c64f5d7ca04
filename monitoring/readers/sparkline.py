"""A small inline SVG sparkline, rendered on the server (no JavaScript, no CDN)."""

from __future__ import annotations

from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe


def sparkline(
    values: list[float | None],
    *,
    width: int = 288,
    height: int = 40,
    top: float | None = None,
    colour: str = "#417690",
    title: str = "",
) -> str:
    """An SVG polyline of `values` (None = gap), scaled to [0, top or max]; safe HTML."""
    present = [v for v in values if v is not None]
    if not present:
        return mark_safe('<span class="quiet">no data</span>')
    top = top or max(present) or 1.0
    step = width / max(1, len(values) - 1)
    segments: list[list[str]] = [[]]
    for i, value in enumerate(values):
        if value is None:
            if segments[-1]:
                segments.append([])
            continue
        y = height - 1 - (height - 2) * min(value, top) / top
        segments[-1].append(f"{i * step:.1f},{y:.1f}")
    lines = "".join(
        f'<polyline fill="none" stroke="{escape(colour)}" stroke-width="1.5" points="{" ".join(points)}"/>'
        for points in segments
        if points
    )
    return format_html(
        '<svg class="sparkline" xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" viewBox="0 0 {} {}" '
        'role="img">'
        '<title>{}</title><rect width="100%" height="100%" fill="#f8f8f8"/>{}</svg>',
        width,
        height,
        width,
        height,
        title,
        mark_safe(lines),  # built above from numbers and an escaped colour only
    )

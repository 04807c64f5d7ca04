"""A GPU's MIG layout drawn as HTML: memory slices across, compute slices below, instances coloured.

Pure presentation for the admin (GpuCapacity and node pages, the reconfiguration confirmation):
each instance is a block spanning its memory slices [start, start + size), labelled with its
profile and compute slices, coloured by profile size; its state (allocated, free, planned, gone)
sets the fill. Inline styles only, so it needs no static files.
"""

from __future__ import annotations

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from .mig.catalog import Product, find_product

# Fill per compute-slice count (1g .. 7g); +me variants share their size's colour.
COLOURS = {1: "#4e79a7", 2: "#59a14f", 3: "#f28e2b", 4: "#e15759", 7: "#76b7b2"}
STATE_STYLE = {
    "allocated": "opacity:1",
    "free": "opacity:.55",
    "planned": "opacity:.8;border-style:dashed",
    "gone": "opacity:.3;text-decoration:line-through",
}
LEGEND = (
    ("allocated", "held by an allocation"),
    ("free", "free instance"),
    ("planned", "planned by a reconfiguration"),
)


def gpu_layout_html(product: Product | str | None, placements, *, mig: bool = True, title: str = "") -> SafeString:
    """One GPU as a grid. `placements`: dicts with profile, start, size and optional state."""
    product = find_product(product) if isinstance(product, str) else product
    if product is None:
        return format_html('<div class="mig-picture">{} <em>no MIG on this GPU model</em></div>', title)
    if not mig:
        return format_html(
            '<div class="mig-picture" style="margin:4px 0">{}<div style="{}">MIG off: one full GPU</div></div>',
            _title(title),
            f"width:{product.memory_slices * 64}px;padding:6px;border:1px solid #888;background:#ddd;"
            "text-align:center;font-size:11px",
        )
    width = 64
    cells = format_html_join(
        "",
        '<div style="position:absolute;left:{}px;top:0;width:{}px;height:14px;border-right:1px solid #bbb;'
        'font-size:9px;color:#666;text-align:center">m{}</div>',
        ((i * width, width - 1, i) for i in range(product.memory_slices)),
    )
    blocks = []
    used_compute = 0
    for p in sorted(placements, key=lambda p: int(p["start"])):
        try:
            profile = product.profile(p["profile"])
        except KeyError:
            continue
        used_compute += profile.compute_slices
        state = p.get("state", "free")
        blocks.append(
            format_html(
                '<div title="{} at memory slice {} ({})" style="position:absolute;left:{}px;top:16px;width:{}px;'
                "height:38px;background:{};color:#fff;border:1px solid #333;box-sizing:border-box;font-size:11px;"
                'overflow:hidden;text-align:center;line-height:18px;{}">{}<br>{}c / {}m</div>',
                profile.name,
                p["start"],
                state,
                int(p["start"]) * width,
                int(p.get("size") or profile.memory_slices) * width,
                COLOURS.get(profile.compute_slices, "#999"),
                STATE_STYLE.get(state, ""),
                profile.name,
                profile.compute_slices,
                profile.memory_slices,
            )
        )
    compute = format_html_join(
        "",
        '<span style="display:inline-block;width:{}px;height:8px;margin-right:1px;background:{}"></span>',
        (
            (product.memory_slices * width // product.compute_slices - 1, "#333" if i < used_compute else "#ddd")
            for i in range(product.compute_slices)
        ),
    )
    return format_html(
        '<div class="mig-picture" style="margin:4px 0">{}'
        '<div style="position:relative;width:{}px;height:56px;background:#f4f4f4;border:1px solid #888">{}{}</div>'
        '<div style="font-size:10px;color:#555">compute {} of {} slices {}</div></div>',
        _title(title),
        product.memory_slices * width,
        cells,
        mark_safe("".join(blocks)),
        used_compute,
        product.compute_slices,
        compute,
    )


def _title(title: str) -> SafeString:
    return format_html('<div style="font-weight:bold;font-size:11px">{}</div>', title) if title else mark_safe("")


def legend_html() -> SafeString:
    sizes = format_html_join(
        " ",
        '<span style="display:inline-block;padding:0 6px;background:{};color:#fff;font-size:11px">{}g</span>',
        ((colour, slices) for slices, colour in COLOURS.items()),
    )
    states = format_html_join(
        " ",
        '<span style="display:inline-block;padding:0 6px;background:#4e79a7;color:#fff;border:1px solid #333;'
        'font-size:11px;{}">{}</span>',
        ((STATE_STYLE[state], text) for state, text in LEGEND),
    )
    return format_html('<div style="margin:4px 0">{} &nbsp; {}</div>', sizes, states)


def gpu_picture(gpu) -> SafeString:
    """The picture of one GpuCapacity row as discovered: active instances, allocated ones solid."""
    layout = gpu.mig_layout()
    instances = list(layout)
    # Held = an unreleased allocation on it, read through the reverse relation: capacity imports no
    # app above it. One filter() call, so both conditions apply to the same allocation (inner join).
    active = layout.filter(allocations__isnull=False, allocations__released_at__isnull=True)
    held = set(active.values_list("pk", flat=True))
    placements = [
        {
            "profile": i.profile.name,
            "start": i.placement_start,
            "size": i.placement_size,
            "state": "allocated" if i.pk in held else "free",
        }
        for i in instances
    ]
    title = f"GPU {gpu.index} · {gpu.product} · {gpu.uuid}"
    return gpu_layout_html(gpu.catalog_product or gpu.product, placements, mig=gpu.mig_mode_current, title=title)


def node_pictures(node) -> SafeString:
    gpus = node.gpus.filter(lost_at__isnull=True).order_by("index")
    return format_html("{}{}", legend_html(), mark_safe("".join(gpu_picture(g) for g in gpus)))

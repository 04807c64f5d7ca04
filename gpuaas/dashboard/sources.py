"""Monitoring and billing reads for the dashboard and the project view.

Every function here runs a fixed number of queries, whatever the fleet size:

- latest_unit_metrics: the newest monitoring Sample of each GPU and MIG instance (last 3 polls).
- health_counters / open_events_by_gpu / recent_health_events: monitoring HealthEvent.
- idle_reservations: monitoring IdleReservation (open flags).
- trespass_events: monitoring TrespassEvent (open, and closed in the last day).
- cluster_series / gpu_series / pool_series: monitoring Rollup5m (5-minute averages).
- month_costs: billing UsageRecord of the current month, through billing.services.draft_lines,
  rounded per line exactly as a statement rounds.

A panel is a dict: {"available": True, "columns": [...], "items": [...], ...} or, when its source
cannot be read, {"available": False, "reason": "..."}; the pages print the reason instead of a number.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import Count, Q
from django.urls import reverse
from django.utils import timezone

from billing.choices import LineType
from billing.periods import month_start
from billing.services import draft_lines
from capacity.choices import SpecKind
from monitoring.choices import HealthLevel, HealthRule, IdleState
from monitoring.models import ANOTHER_PROJECT, HealthEvent, IdleReservation, Sample, Series, TrespassEvent
from monitoring.readers.samples import sample_rows
from tenancy.models import Project

EVENTS_SHOWN = 25
IDLE_SHOWN = 25
THROTTLE_RULES = (HealthRule.THERMAL_THROTTLE, HealthRule.POWER_THROTTLE)


def unavailable(reason: str) -> dict:
    return {"available": False, "reason": reason}


def rounded(value, places: int = 1):
    return None if value is None else round(float(value), places)


def metrics_available() -> bool:
    """Whether any metric sample exists at all (the metric colourings are offered only then)."""
    return Sample.objects.exists()


# ---------------------------------------------------------------------------------------------
# Latest readings per unit
# ---------------------------------------------------------------------------------------------


def latest_unit_metrics(gpu_ids) -> dict:
    """{(gpu_id, mig_instance_id or None): {"power_w", "sm_active_pct", "gpu_util_pct", "temperature_c", "at"}}.

    The newest sample of each series within the last three polling intervals; a unit with no
    recent sample is absent (shown as "no data", never as zero). `gpu_ids`: a list or a subquery.
    """
    if isinstance(gpu_ids, list) and not gpu_ids:
        return {}
    since = timezone.now() - timedelta(seconds=3 * settings.METRICS_INTERVAL_S)
    units = {
        sid: (gpu, mig)
        for sid, gpu, mig in Series.objects.filter(gpu_id__in=gpu_ids, vgpu_uuid="").values_list(
            "id", "gpu_id", "mig_instance_id"
        )
    }
    latest = {}
    for sid, ts, power, sm_active, gpu_util, temp in sample_rows(
        units, since, columns=("power_w", "sm_active", "gpu_util", "temp_c")
    ):
        latest[units[sid]] = {
            "power_w": rounded(power),
            "sm_active_pct": rounded(sm_active),
            "gpu_util_pct": gpu_util,
            "temperature_c": temp,
            "at": ts.isoformat(),
        }
    return latest


# ---------------------------------------------------------------------------------------------
# Health
# ---------------------------------------------------------------------------------------------


def health_counters(cluster_ids: list[int]) -> dict:
    """{cluster_id: {"error", "throttling", "caution"}}: GPUs with an open health event of each kind.

    Error = a critical event; Throttling = a thermal or power throttling event; Caution = another
    warning. A GPU counts once per kind (two critical XIDs on one GPU are one GPU in error). One query.
    """
    throttle = Q(rule__in=THROTTLE_RULES)
    rows = (
        HealthEvent.objects.open()
        .filter(gpu__node__cluster_id__in=cluster_ids)
        .values("gpu__node__cluster_id")
        .annotate(
            error=Count("gpu", filter=Q(level=HealthLevel.CRITICAL), distinct=True),
            throttling=Count("gpu", filter=throttle, distinct=True),
            caution=Count("gpu", filter=Q(level=HealthLevel.WARNING) & ~throttle, distinct=True),
        )
        .order_by()
    )
    counters = {pk: {"error": 0, "throttling": 0, "caution": 0} for pk in cluster_ids}
    for row in rows:
        counters[row["gpu__node__cluster_id"]] = {k: row[k] for k in ("error", "throttling", "caution")}
    return counters


def open_events_by_gpu(gpu_ids) -> dict[int, list[dict]]:
    """{gpu_id: [{"level", "rule", "mig_instance_id"}]} of open health events. One query."""
    events: dict[int, list[dict]] = defaultdict(list)
    for event in HealthEvent.objects.open().filter(gpu_id__in=gpu_ids).order_by("gpu_id", "-opened_at", "-id"):
        events[event.gpu_id].append(
            {
                "level": event.level,
                "level_label": event.get_level_display(),
                "rule": event.get_rule_display(),
                "mig_instance_id": event.mig_instance_id,
            }
        )
    return events


def recent_health_events() -> dict:
    """Open health events, newest first, with where they are. Two queries."""
    events = HealthEvent.objects.open()
    rows = events.select_related("gpu__node__cluster", "mig_instance__profile").order_by("-opened_at", "-id")[
        :EVENTS_SHOWN
    ]
    total = events.count()
    items = []
    for event in rows:
        node = event.gpu.node
        items.append(
            {
                "id": event.pk,
                "level": f"{'⛔' if event.level == HealthLevel.CRITICAL else '⚠'} {event.get_level_display()}",
                "rule": event.get_rule_display(),
                "where": f"{node.cluster.name}/{node.name} GPU {event.gpu.index}"
                + (
                    f" {event.mig_instance.profile.name}@{event.mig_instance.placement_start}"
                    if event.mig_instance
                    else ""
                ),
                "message": event.message,
                "opened_at": event.opened_at.isoformat(),
                "occurrences": event.occurrences,
                "url": reverse("admin:gpuaas_dashboard_gpu", args=[event.gpu_id]),
            }
        )
    return {
        "available": True,
        "summary": f"{total} open event{'s' if total != 1 else ''}"
        + (f", newest {len(items)} shown" if total > len(items) else ""),
        "empty": "No open health events.",
        "columns": [
            {"key": "level", "label": "Level"},
            {"key": "rule", "label": "Rule"},
            {"key": "where", "label": "Where", "link": "url"},
            {"key": "message", "label": "Message"},
            {"key": "occurrences", "label": "Seen", "num": True, "digits": 0},
            {"key": "opened_at", "label": "Since", "type": "datetime"},
        ],
        "items": items,
    }


# ---------------------------------------------------------------------------------------------
# Trespass events
# ---------------------------------------------------------------------------------------------


def trespass_events(project_ids: list[int] | None = None) -> dict:
    """Trespass events open now or ended in the last day, newest first. Two queries.

    `project_ids` None: the operator's fleet-wide view. Otherwise only events on those projects' units or
    by their pods, and any other side is "another project" with nothing that names it: no slug, namespace
    or pod (TrespassEvent.as_seen_by).
    """
    events = TrespassEvent.objects.filter(
        Q(ended_at__isnull=True) | Q(ended_at__gte=timezone.now() - timedelta(days=1))
    )
    if project_ids is not None:
        events = events.filter(Q(owner_project_id__in=project_ids) | Q(project_id__in=project_ids))
    rows = events.select_related("gpu__node__cluster", "mig_instance__profile", "owner_project", "project").order_by(
        "-started_at", "-id"
    )[:EVENTS_SHOWN]
    total = events.filter(ended_at__isnull=True).count()

    visible = None if project_ids is None else set(project_ids)
    items = []
    for event in rows:
        node = event.gpu.node
        unit = f" {event.mig_instance.profile.name}@{event.mig_instance.placement_start}" if event.mig_instance else ""
        sides = event.as_seen_by(visible)
        if sides.pod_name:
            by = f"{sides.namespace}/{sides.pod_name}"
        else:
            by = sides.project if sides.project == ANOTHER_PROJECT else "unknown process"
        items.append(
            {
                "id": event.pk,
                "kind": event.get_kind_display(),
                "where": f"{node.cluster.name}/{node.name} GPU {event.gpu.index}{unit}",
                "owner": sides.owner or "unallocated",
                "by": by,
                "project": sides.project or "–",
                "state": "open" if event.ended_at is None else "closed",
                "started_at": event.started_at.isoformat(),
                "url": reverse("admin:gpuaas_dashboard_gpu", args=[event.gpu_id]) if project_ids is None else "",
            }
        )
    return {
        "available": True,
        "summary": f"{total} open event{'s' if total != 1 else ''}",
        "empty": "No trespass: every unit in use is used by its own project.",
        "columns": [
            {"key": "kind", "label": "Kind"},
            {"key": "where", "label": "Unit", "link": "url"},
            {"key": "owner", "label": "Held by"},
            {"key": "by", "label": "Used by"},
            {"key": "project", "label": "Project"},
            {"key": "state", "label": "State"},
            {"key": "started_at", "label": "Since", "type": "datetime"},
        ],
        "items": items,
    }


# ---------------------------------------------------------------------------------------------
# Idle reservations
# ---------------------------------------------------------------------------------------------


def idle_reservations(project_ids: list[int] | None = None) -> dict:
    """Open idle-reservation flags: allocations whose unit stayed idle, with the proposal. Two queries."""
    flags = IdleReservation.objects.filter(state=IdleState.OPEN)
    if project_ids is not None:
        flags = flags.filter(allocation__project_id__in=project_ids)
    rows = flags.select_related("allocation__pool__project", "allocation__gpu__node__cluster").order_by(
        "-detected_at", "-id"
    )[:IDLE_SHOWN]
    total = flags.count()
    items = []
    for flag in rows:
        allocation = flag.allocation
        unit = allocation.profile_name or ("full GPU" if allocation.kind == SpecKind.FULL else "time-slice")
        node = allocation.gpu.node  # the unit's own cluster: a pool may span several
        proposal = flag.get_proposal_display() + (f" to {flag.suggested_profile}" if flag.suggested_profile else "")
        items.append(
            {
                "id": flag.pk,
                "project": allocation.pool.project.slug,
                "pool": allocation.pool.name,
                "unit": f"{allocation.product} {unit} on {node.cluster.name}/{node.name} GPU {allocation.gpu.index}",
                "sm_active_avg": flag.sm_active_avg,
                "window": f"{flag.window_start:%Y-%m-%d %H:%M} – {flag.window_end:%H:%M} UTC",
                "proposal": proposal,
                "detected_at": flag.detected_at.isoformat(),
            }
        )
    return {
        "available": True,
        "summary": f"{total} open flag{'s' if total != 1 else ''}"
        + (f", newest {len(items)} shown" if total > len(items) else ""),
        "empty": "No idle reservations.",
        "columns": [
            {"key": "project", "label": "Project"},
            {"key": "pool", "label": "Pool"},
            {"key": "unit", "label": "Unit"},
            {"key": "sm_active_avg", "label": "SM avg", "type": "percent", "num": True},
            {"key": "window", "label": "Window"},
            {"key": "proposal", "label": "Proposal"},
        ],
        "items": items,
    }


# ---------------------------------------------------------------------------------------------
# Costs (billing)
# ---------------------------------------------------------------------------------------------


def month_costs(project_ids: list[int] | None = None) -> dict:
    """This month's cost per project so far: unit-hours, reserved, credits, total and used. Two queries.

    Built from the same lines a statement would have now: billing.services.draft_lines()
    groups this month's usage records into rounded statement lines (unsaved), so the figures match the
    draft statement billing would generate
    (before any adjustment). Usage is metered hour by hour: the current hour joins once metered.
    """
    period = month_start(timezone.now())
    totals: dict[int, dict] = {}
    for row, lines in draft_lines(period, project_ids=project_ids):
        entry = totals.setdefault(
            row["project_id"], {"reserved": Decimal(0), "credits": Decimal(0), "used": None, "hours": Decimal(0)}
        )
        for line in lines:
            if line.line_type == LineType.USAGE:
                entry["reserved"] += line.amount
                entry["hours"] += line.hours
                if line.used_amount is not None:
                    entry["used"] = (entry["used"] or Decimal(0)) + line.used_amount
            else:
                entry["credits"] += line.amount
    slugs = dict(Project.objects.filter(pk__in=list(totals)).values_list("pk", "slug"))
    items = [
        {
            "id": pk,
            "project": slugs.get(pk, str(pk)),
            "hours": f"{entry['hours']:.1f}",
            "reserved": f"{entry['reserved']:.2f}",
            "credits": f"{entry['credits']:.2f}",
            "total": f"{entry['reserved'] + entry['credits']:.2f}",
            "used": None if entry["used"] is None else f"{entry['used']:.2f}",
        }
        for pk, entry in sorted(totals.items(), key=lambda kv: (-(kv[1]["reserved"] + kv[1]["credits"]), kv[0]))
    ]
    grand = sum((Decimal(i["total"]) for i in items), Decimal(0))
    currency = settings.BILLING_CURRENCY
    return {
        "available": True,
        "month": period.strftime("%Y-%m"),
        "currency": currency,
        "total": f"{grand:.2f}",
        "summary": f"{period:%B %Y} so far, in {currency}: {grand:.2f} in total.",
        "empty": "No usage metered this month yet.",
        "footer": "Reserved = held units × hourly rate from approval; Used = reserved × SM activity where measured.",
        "columns": [
            {"key": "project", "label": "Project"},
            {"key": "hours", "label": "Unit-hours", "num": True},
            {"key": "reserved", "label": "Reserved", "num": True},
            {"key": "credits", "label": "Credits", "num": True},
            {"key": "total", "label": "Total", "num": True},
            {"key": "used", "label": "Used", "num": True},
        ],
        "items": items,
    }

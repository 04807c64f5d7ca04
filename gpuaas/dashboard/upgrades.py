"""The operator dashboard's rolling upgrades panel: the rollouts under way (operations.models.DriverUpgrade).

Two queries whatever the fleet: the open rollouts (and cancelled ones with nodes still out) with their node
counts aggregated in SQL (DriverUpgradeQuerySet.with_progress), and the maintenance windows of their clusters,
from which each rollout's next window is worked out here (MaintenanceWindow.is_open / next_opening: a window
of the cluster, or of the rollout's node group).
"""

from __future__ import annotations

from django.urls import reverse
from django.utils import timezone

from capacity.models import MaintenanceWindow
from operations.models import DriverUpgrade

SHOWN = 10


def _next_window(windows, rollout, now) -> str:
    """ "open now" or when the next window for the rollout's nodes opens (UTC); "none" when no window is left."""
    group = rollout.node_group  # empty: the rollout's nodes may be of any group, so any window of the cluster counts
    mine = [w for w in windows if w.cluster_id == rollout.cluster_id and (not group or w.node_group in ("", group))]
    if any(w.is_open(now) for w in mine):
        return "open now"
    openings = [o[0] for o in (w.next_opening(now) for w in mine) if o]
    return f"{min(openings):%Y-%m-%d %H:%M} UTC" if openings else "none scheduled"


def driver_upgrades_panel() -> dict:
    """Rollouts under way, newest first: nodes done/total, failed, current wave, next window. Two queries."""
    now = timezone.now()
    rows = list(
        DriverUpgrade.objects.to_tick().with_progress().select_related("cluster").order_by("-created_at", "-id")[:SHOWN]
    )
    clusters = {r.cluster_id for r in rows}
    windows = list(MaintenanceWindow.objects.enabled().filter(cluster_id__in=clusters)) if clusters else []
    items = [
        {
            "id": r.pk,
            "rollout": r.name or f"#{r.pk}",
            "cluster": r.cluster.name,
            "state": r.get_state_display().split(" (")[0],
            "mode": r.mode,
            "done": f"{r.nodes_done} / {r.nodes_total}",
            "failed": r.nodes_failed,
            "wave": r.current_wave,
            "next_window": _next_window(windows, r, now),
            "waiting_for": r.waiting_for,
            "url": reverse("admin:operations_driverupgrade_change", args=[r.pk]),
        }
        for r in rows
    ]
    return {
        "available": True,
        "summary": f"{len(items)} rollout{'s' if len(items) != 1 else ''} under way"
        + (f", newest {SHOWN} shown" if len(items) == SHOWN else ""),
        "empty": "No rolling upgrade under way.",
        "columns": [
            {"key": "rollout", "label": "Rollout", "link": "url"},
            {"key": "cluster", "label": "Cluster"},
            {"key": "state", "label": "State"},
            {"key": "done", "label": "Done / total"},
            {"key": "failed", "label": "Failed", "num": True, "digits": 0},
            {"key": "wave", "label": "Wave", "num": True, "digits": 0},
            {"key": "next_window", "label": "Next window"},
            {"key": "waiting_for", "label": "Waiting for"},
        ],
        "items": items,
    }

"""docs/demo.md's claims table, and what a seeded demo world shows for each claim.

Shared by tests/capacity/test_demo_world.py (the claims against a fresh world) and
tests/browser/test_browser_demo_walk.py (the same world as the operator's and the member's screens show it).
"""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

from capacity.models import Cluster, NodeCapacity, WorkloadProfile
from monitoring.models import HealthEvent, IdleReservation, TrespassEvent
from monitoring.services.reports import poll_node
from monitoring.services.trespass import detect_trespass, owners
from pools.choices import RequestState
from pools.models import GpuPool, PoolRequest

DOC = Path(settings.BASE_DIR) / "docs" / "demo.md"


def doc_claims() -> dict[str, int]:
    """The table under "What appears" in docs/demo.md: claim -> number."""
    text = DOC.read_text()
    section = text.split("<!-- demo-claims -->", 1)[1].split("<!-- /demo-claims -->", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \| (\d+) \|", section, flags=re.M)
    return {claim: int(value) for claim, value in rows}


def doc_idle_pools() -> set[str]:
    """The pools docs/demo.md names where it first lists the idle reservations: "idle reservations (...)"."""
    named = re.search(r"idle reservations \(([^)]*)\)", DOC.read_text()).group(1)
    return set(re.findall(r"`([^`]+)`", named))


def poll_all(at, sim=None) -> None:
    """One live poll of every node; with `sim`, the simulator's clock moves one poll interval first (its
    ticker does that in `make demo`; in tests time moves only when told)."""
    if sim is not None:
        sim.state.tick(settings.METRICS_INTERVAL_S)
    for node in NodeCapacity.objects.present():
        assert poll_node(node.pk, at=at).error == ""


def detect_all_trespass(at) -> int:
    """Run trespass detection on every cluster; the number of findings."""
    return sum(len(detect_trespass(c.pk, at=at).findings) for c in Cluster.objects.all())


def pods_off_their_pools() -> list[str]:
    """Team pods running on units their project's pools do not hold."""
    found = []
    for cluster in Cluster.objects.all():
        held = owners(cluster)
        for w in WorkloadProfile.objects.running().filter(cluster=cluster):
            if w.project_id is None or w.project_id not in held.get((w.gpu_id, w.mig_instance_id), set()):
                found.append(f"{w.namespace}/{w.pod_name}")
    return found


def world_claims() -> dict[str, int]:
    """What the database holds for each claim of docs/demo.md's table."""
    return {
        "requests waiting for approval": PoolRequest.objects.filter(state=RequestState.SUBMITTED).count(),
        "active pools": GpuPool.objects.filter(state="active").count(),
        "team pods running": WorkloadProfile.objects.running().exclude(project=None).count(),
        "pods outside their pool's units": len(pods_off_their_pools()),
        "idle reservations": IdleReservation.objects.open().count(),
        "open health events": HealthEvent.objects.filter(resolved_at__isnull=True).count(),
        "open trespass events": TrespassEvent.objects.open().count(),
    }

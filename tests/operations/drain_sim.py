"""Shared set-up for the drain-and-move tests: a simulated cluster of MIG nodes, reservations, a driver.
Not a test module (no test_ prefix)."""

from __future__ import annotations

from reconfig_sim import allocate, gpu_row, start_sim

from capacity.models import NodeDrain
from operations import maintenance
from operations.tasks import drain_step_task
from tenancy.models import Project

LAYOUT = {0: ["3g.40gb", "3g.40gb"]}
TERMINAL = ("succeeded", "failed", "cancelled")


def fleet(tmp_path, names=("gpu-a", "gpu-b", "gpu-c"), **kwargs):
    """Nodes of one H100 each, GPU 0 split in two 3g.40gb (the second GPU stays whole)."""
    return start_sim(tmp_path, [(n, "H100-80GB", 2, LAYOUT, "") for n in names], **kwargs)


def project(slug: str) -> Project:
    return Project.objects.get_or_create(slug=slug, defaults={"name": slug.title(), "namespace": slug})[0]


def reserve(node: str, start: int, slug: str = "team-a"):
    """An active reservation of the 3g.40gb at `start` on GPU 0 of `node`."""
    return allocate(gpu_row(node, 0), mig_start=start, project=project(slug))


def drive(drain: NodeDrain, *, max_calls: int = 30) -> list[str]:
    """Call the step task for the drain's current step until it ends or rests handed over."""
    outcomes = []
    for _ in range(max_calls):
        drain.refresh_from_db()
        if drain.state in TERMINAL or (drain.step == "handover" and drain.give_back_at is None and outcomes):
            if outcomes and outcomes[-1].startswith("handover"):
                break
            if drain.state in TERMINAL:
                break
        outcome = drain_step_task(drain.pk, drain.step)
        outcomes.append(f"{drain.step}:{outcome}")
    drain.refresh_from_db()
    return outcomes


__all__ = ["drive", "fleet", "maintenance", "project", "reserve"]

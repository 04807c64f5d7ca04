"""A worker killed at any step of drain-and-move: the step comes back (redelivered, or swept once its
lease lapses) and the drain finishes with every reservation moved once, each project told once."""

from datetime import timedelta

import pytest
from django.utils import timezone
from drain_sim import drive, fleet, reserve

from capacity.models import NodeCapacity, NodeDrain
from notifications.models import Event
from operations import maintenance
from operations.tasks import drain_step_task

pytestmark = pytest.mark.django_db

STEPS = ["check", "notify", "cordon", "move", "evict", "handover", "uncordon"]


class WorkerKilled(BaseException):
    """Stands for SIGKILL of the worker: not an Exception, so nothing in the step catches it."""


@pytest.fixture
def sim(tmp_path):
    sim = fleet(tmp_path)
    yield sim
    sim.server.stop()


def run_until(drain: NodeDrain, step: str) -> None:
    for name in STEPS[: STEPS.index(step)]:
        if name == "handover":
            assert drain_step_task(drain.pk, name) == "waiting"
            maintenance.give_back(drain)
        assert drain_step_task(drain.pk, name) == "advanced", name


@pytest.mark.parametrize("recovery", ["sweep", "redelivery"])
@pytest.mark.parametrize("step", STEPS)
def test_a_worker_killed_after_a_steps_work_is_recovered(sim, monkeypatch, settings, step, recovery):
    allocations = [reserve("gpu-a", 0), reserve("gpu-a", 4, "team-b")]
    sim.add_gpu_pod("gpu-a", "trainer", "nvidia.com/mig-3g.40gb")
    drain = maintenance.start(NodeCapacity.objects.get(name="gpu-a"), grace_s=0)
    run_until(drain, step)
    if step == "handover":
        maintenance.give_back(drain)
    real = maintenance.STEPS[step]

    def work_then_die(row, now):
        real(row, now)
        raise WorkerKilled

    monkeypatch.setitem(maintenance.STEPS, step, work_then_die)
    with pytest.raises(WorkerKilled):
        drain_step_task(drain.pk, step)
    drain.refresh_from_db()
    assert (drain.step, drain.state) == (step, "running")
    monkeypatch.setitem(maintenance.STEPS, step, real)

    if recovery == "sweep":
        assert maintenance.sweep(now=timezone.now()) == {"stale_claims": 0, "requeued": 0}  # the lease still runs
        lapsed = timezone.now() + timedelta(seconds=settings.WORKFLOW_LEASE_S + 1)
        assert maintenance.sweep(now=lapsed)["stale_claims"] == 1
        drain.refresh_from_db()
        assert drain.state == "pending"
    else:
        assert drain_step_task(drain.pk, step) in ("advanced", "waiting")  # same task id: re-entered
    drive(drain)
    if drain.give_back_at is None:
        maintenance.give_back(drain)
        drive(drain)

    assert drain.state == "succeeded", drain.error
    assert sorted(m["allocation"] for m in drain.moves) == sorted(a.pk for a in allocations)
    for a in allocations:
        a.refresh_from_db()
        assert a.released_at is None and a.gpu.node.name != "gpu-a"
    assert Event.objects.filter(kind="maintenance_notice").count() == 2
    assert not sim.node("gpu-a").unschedulable
    assert drain.steps.filter(step=step, event="completed").count() == 1

"""Refusals: allocated GPUs without drain, outside maintenance windows without force, one open per node."""

import datetime as dt
from datetime import timedelta

import pytest
from django.utils import timezone
from reconfig_sim import allocate, drive, gpu_row, node_row, start_sim

from capacity.models import MaintenanceWindow, MigReconfiguration, MigReconfigurationStep
from operations import reconfiguration as rc
from operations.tasks import reconfiguration_step_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"]}, "")])
    yield sim
    sim.server.stop()


def nothing_written():
    return MigReconfiguration.objects.count() == 0 and MigReconfigurationStep.objects.count() == 0


def test_refused_while_an_affected_gpu_is_allocated_unless_drain(sim, django_capture_on_commit_callbacks):
    allocation = allocate(gpu_row("gpu-a", 0), mig_start=0)
    node = node_row("gpu-a")

    with django_capture_on_commit_callbacks() as callbacks, pytest.raises(rc.Refused) as refused:
        rc.create(node, {"0": ["7g.80gb"]}, backend="agent", force=True)

    assert str(refused.value) == (
        "1 active allocation(s) on affected GPUs (GPU 0: 1); choose drain to evict their pods"
    )
    assert callbacks == []
    assert nothing_written()
    assert sim.layout("gpu-a", 0) == [("3g.40gb", 0), ("3g.40gb", 4)]

    with django_capture_on_commit_callbacks() as callbacks:
        reconf = rc.create(node, {"0": ["7g.80gb"]}, backend="agent", drain=True, force=True)
    assert len(callbacks) == 1
    assert reconf.drain is True
    assert reconfiguration_step_task(reconf.pk, "plan") == "advanced"
    assert reconfiguration_step_task(reconf.pk, "check") == "advanced"
    check = reconf.steps.get(step="check", event="completed")
    assert check.detail == {"allocations": [allocation.pk]}
    assert (
        check.message
        == "1 allocation(s) on affected GPUs: their pods will be evicted; outside maintenance windows (forced)"
    )


def test_agent_path_only_counts_allocations_on_changed_gpus(sim):
    allocate(gpu_row("gpu-a", 0), mig_start=0)
    reconf = rc.create(node_row("gpu-a"), {"1": ["7g.80gb"]}, backend="agent", force=True)
    assert reconf.pk is not None


def test_operator_path_counts_allocations_on_every_gpu_of_the_node(sim):
    allocate(gpu_row("gpu-a", 0), mig_start=0)
    with pytest.raises(rc.Refused):
        rc.create(node_row("gpu-a"), {"1": ["7g.80gb"]}, backend="operator", force=True)
    assert nothing_written()


def test_refused_outside_maintenance_windows_unless_forced(sim, django_capture_on_commit_callbacks):
    node = node_row("gpu-a")
    now = timezone.now()
    MaintenanceWindow.objects.create(
        cluster=sim.cluster, starts_at=now + timedelta(days=2), ends_at=now + timedelta(days=2, hours=4)
    )

    with django_capture_on_commit_callbacks() as callbacks, pytest.raises(rc.Refused) as refused:
        rc.create(node, {"1": ["7g.80gb"]})
    opens = (now + timedelta(days=2)).astimezone(dt.UTC)
    assert str(refused.value) == (
        f"outside every maintenance window of {node}; the next opens {opens:%Y-%m-%d %H:%M} UTC; force to run now"
    )
    assert callbacks == []
    assert nothing_written()

    reconf = rc.create(node, {"1": ["7g.80gb"]}, force=True)
    assert reconf.force is True


def test_allowed_inside_an_open_window_of_the_nodes_group(sim):
    node = node_row("gpu-a")
    now = timezone.now()
    MaintenanceWindow.objects.create(
        cluster=sim.cluster, node_group="other", starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=1)
    )
    with pytest.raises(rc.Refused):
        rc.create(node, {"1": ["7g.80gb"]})
    MaintenanceWindow.objects.create(
        cluster=sim.cluster, starts_at=now - timedelta(minutes=30), ends_at=now + timedelta(minutes=30)
    )
    reconf = rc.create(node, {"1": ["7g.80gb"]})
    drive(sim, reconf)
    assert reconf.state == "succeeded", reconf.error
    assert reconf.steps.get(step="check", event="completed").message == "inside a maintenance window"


def test_the_check_step_refuses_what_changed_after_creation(sim):
    reconf = rc.create(node_row("gpu-a"), {"0": ["7g.80gb"]}, backend="agent", force=True)
    assert reconfiguration_step_task(reconf.pk, "plan") == "advanced"
    allocate(gpu_row("gpu-a", 0), mig_start=4)

    assert reconfiguration_step_task(reconf.pk, "check") == "failed"
    reconf.refresh_from_db()
    assert reconf.failed_step == "check"
    assert reconf.error.startswith("1 active allocation(s) on affected GPUs (GPU 0: 1)")
    assert sim.node("gpu-a").unschedulable is False  # never cordoned
    rc.cancel(reconf)
    reconf.refresh_from_db()
    assert reconf.state == "cancelled"


def test_one_open_reconfiguration_per_node(sim):
    node = node_row("gpu-a")
    first = rc.create(node, {"1": ["7g.80gb"]}, force=True)
    with pytest.raises(rc.IllegalTransition):
        rc.create(node, {"1": ["1g.10gb"]}, force=True)
    assert MigReconfiguration.objects.get() == first


def test_illegal_transitions(sim):
    reconf = rc.create(node_row("gpu-a"), {"1": ["7g.80gb"]}, force=True)
    with pytest.raises(rc.IllegalTransition):
        rc.resume(reconf)
    with pytest.raises(rc.IllegalTransition):
        rc.rollback(reconf)
    drive(sim, reconf)
    with pytest.raises(rc.IllegalTransition):
        rc.cancel(reconf)
    reconf.refresh_from_db()
    assert reconf.state == "succeeded"
    assert reconf.steps.filter(event__in=["resumed", "rollback", "cancelled"]).count() == 0


def test_an_invalid_layout_is_refused_before_anything_is_written(sim):
    with pytest.raises(rc.ReconfigurationError) as error:
        rc.create(node_row("gpu-a"), {"0": ["4g.40gb", "4g.40gb"]}, force=True)
    assert str(error.value) == "GPU 0: too many instances of 4g.40gb: 2 (max 1)"
    assert nothing_written()

"""Drain-and-move: a node's reservations move to equivalent free units, its pods go after the notice,
it is handed over, and it comes back uncordoned once given back healthy."""

from datetime import timedelta

import pytest
from django.utils import timezone
from drain_sim import drive, fleet, reserve

from capacity.models import MigInstance, NodeCapacity, NodeDrain
from notifications.models import Event
from operations import maintenance
from operations.reconfiguration import IllegalTransition, Refused
from pools.models import Allocation

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = fleet(tmp_path)
    yield sim
    sim.server.stop()


def node(name: str) -> NodeCapacity:
    return NodeCapacity.objects.get(name=name)


def running(sim, name: str, namespace: str = "team-a") -> bool:
    record = sim.sim_cluster.pods.get((namespace, name))
    return record is not None and not record.obj["metadata"].get("deletionTimestamp")


def where(allocation: Allocation) -> str:
    allocation.refresh_from_db()
    return allocation.gpu.node.name


def test_a_loaded_node_is_drained_moved_handed_over_and_given_back(sim, django_capture_on_commit_callbacks):
    first, second = reserve("gpu-a", 0), reserve("gpu-a", 4, "team-b")
    sim.add_gpu_pod("gpu-a", "trainer", "nvidia.com/mig-3g.40gb")
    before = {a.pk: (a.allocated_at, a.profile_name) for a in (first, second)}
    drain = maintenance.start(node("gpu-a"), reason="driver 570", grace_s=0)

    outcomes = drive(drain)

    assert outcomes[:6] == [
        "check:advanced",
        "notify:advanced",
        "cordon:advanced",
        "move:advanced",
        "evict:advanced",
        "handover:waiting",
    ]
    assert (drain.step, drain.state, drain.phase) == ("handover", "waiting", "in maintenance")
    assert {where(first), where(second)} <= {"gpu-b", "gpu-c"}
    for a in (first, second):
        a.refresh_from_db()
        assert a.released_at is None and (a.allocated_at, a.profile_name) == before[a.pk]  # billing goes on
        assert a.mig_instance.profile.name == "3g.40gb" and a.mig_instance.gpu.node.name != "gpu-a"
    assert sorted(m["allocation"] for m in drain.moves) == sorted([first.pk, second.pk])
    assert sim.node("gpu-a").unschedulable and node("gpu-a").cordoned
    assert not running(sim, "trainer")
    notices = Event.objects.filter(kind="maintenance_notice").order_by("project__slug")
    assert [(e.project.slug, e.payload["allocations"]) for e in notices] == [
        ("team-a", [first.pk]),
        ("team-b", [second.pk]),
    ]

    maintenance.give_back(drain)
    outcomes = drive(drain)
    assert outcomes == ["handover:advanced", "uncordon:advanced"]
    assert drain.state == "succeeded"
    assert not sim.node("gpu-a").unschedulable and not node("gpu-a").cordoned
    # The units of gpu-a are free again for approval.
    assert MigInstance.objects.free().filter(gpu__node__name="gpu-a").count() == 2


def test_the_same_projects_other_node_is_preferred(sim):
    on_c = reserve("gpu-c", 0)  # team-a already holds a unit on gpu-c (and nothing on gpu-b)
    moving = reserve("gpu-a", 0)
    drive(maintenance.start(node("gpu-a"), grace_s=0))
    assert where(moving) == "gpu-c"
    assert where(on_c) == "gpu-c"


def test_a_reservation_that_cannot_move_is_refused_with_the_shortfall_and_nothing_changes(
    sim, django_capture_on_commit_callbacks
):
    for n in ("gpu-a", "gpu-b", "gpu-c"):
        reserve(n, 0)
        reserve(n, 4, "team-b")
    rows = list(Allocation.objects.order_by("pk").values())
    with django_capture_on_commit_callbacks() as callbacks, pytest.raises(Refused) as refused:
        maintenance.start(node("gpu-a"))
    assert "short of 2 x H100-80GB 3g.40gb" in str(refused.value)
    assert refused.value.detail["shortfall"] == {"H100-80GB 3g.40gb": 2}
    assert callbacks == []
    assert not NodeDrain.objects.exists()
    assert list(Allocation.objects.order_by("pk").values()) == rows
    assert not sim.node("gpu-a").unschedulable and not node("gpu-a").cordoned


def test_units_taken_after_the_check_fail_the_move_leaving_the_node_cordoned_and_resume_finishes(sim):
    moving = reserve("gpu-a", 0)
    drain = maintenance.start(node("gpu-a"), grace_s=0)
    for name in ("check", "notify", "cordon"):
        drain.refresh_from_db()
        assert drive_one(drain) == "advanced", name
    taken = [reserve("gpu-b", 0, "team-z"), reserve("gpu-b", 4, "team-z")]  # the free reserve is gone
    taken += [reserve("gpu-c", 0, "team-z"), reserve("gpu-c", 4, "team-z")]
    assert drive_one(drain) == "failed"
    drain.refresh_from_db()
    assert (drain.step, drain.state) == ("move", "failed")
    assert "could not move" in drain.error and "H100-80GB 3g.40gb" in drain.error
    assert where(moving) == "gpu-a" and sim.node("gpu-a").unschedulable

    taken[0].released_at = timezone.now()
    taken[0].save(update_fields=["released_at"])
    Allocation.objects.filter(pk=taken[0].pk).update(vacated_at=timezone.now())
    maintenance.resume(drain)
    drive(drain)
    assert (drain.step, drain.state) == ("handover", "waiting")
    assert where(moving) == "gpu-b"


def drive_one(drain) -> str:
    from operations.tasks import drain_step_task

    drain.refresh_from_db()
    return drain_step_task(drain.pk, drain.step)


def test_pods_stay_until_the_notice_deadline(sim):
    reserve("gpu-a", 0)
    sim.add_gpu_pod("gpu-a", "trainer", "nvidia.com/mig-3g.40gb")
    drain = maintenance.start(node("gpu-a"), grace_s=600)
    outcomes = drive(drain, max_calls=6)
    assert outcomes[-1] == "evict:waiting"
    assert running(sim, "trainer")
    later = drain.evict_after + timedelta(seconds=1)
    assert maintenance.run_step(drain.pk, "evict", token="t", now=later) == "advanced"
    assert not running(sim, "trainer")
    assert drain.steps.get(step="evict", event="info").detail == {"evicted": ["team-a/trainer"]}


def test_a_second_drain_of_the_node_and_give_back_before_handover_are_illegal(sim):
    drain = maintenance.start(node("gpu-a"), grace_s=0)
    with pytest.raises(IllegalTransition):
        maintenance.start(node("gpu-a"))
    with pytest.raises(IllegalTransition):
        maintenance.give_back(drain)


def test_given_back_unhealthy_waits_for_health(sim):
    drain = maintenance.start(node("gpu-a"), grace_s=0)
    drive(drain)
    maintenance.give_back(drain)
    from capacity.models import GpuCapacity

    GpuCapacity.objects.filter(node__name="gpu-a", index=1).update(health="failed")
    assert drive_one(drain) == "waiting"
    drain.refresh_from_db()
    assert drain.phase == "given back, waiting for health"
    assert "GPU 1 is failed" in drain.steps.filter(event="waiting").last().message

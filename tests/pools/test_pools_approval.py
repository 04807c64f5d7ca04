"""Approval: units picked from healthy, free capacity on one cluster; shortages say what is missing."""

import pytest

from capacity.choices import GpuHealth
from capacity.models import GpuCapacity, MigInstance, NodeCapacity, WorkloadProfile
from pools import services
from pools.exceptions import DomainError, IllegalTransition, InsufficientCapacity
from pools.models import Allocation, GpuPool, PoolRequest, PoolRequestTransition

pytestmark = pytest.mark.django_db
THREE_THREE = ["3g.40gb", "3g.40gb"]


def enqueued(callbacks):
    """(task name, args) of the pools tasks a list of on_commit callbacks would enqueue (not the notifications
    app's deliveries of the same events: tests/notifications)."""
    return [(cb.func.__self__.name, cb.args) for cb in callbacks if cb.func.__self__.name.startswith("pools.")]


def test_mig_approval_packs_units_and_starts_provisioning(
    fleet, make_request, operator, django_capture_on_commit_callbacks
):
    fleet.mig_node("n1", [THREE_THREE, THREE_THREE])
    request = make_request(count=3, tags=["llm"])
    with django_capture_on_commit_callbacks() as callbacks:
        pool = services.approve(request, actor=operator, reason="fits")
    assert enqueued(callbacks) == [("pools.tasks.provision_pool_task", (pool.pk,))]
    request.refresh_from_db()
    assert request.state == "provisioning"
    assert request.approved_by == operator
    allocations = list(pool.allocations.select_related("gpu", "mig_instance"))
    assert [(a.gpu.index, a.mig_instance.placement_start) for a in allocations] == [(0, 0), (0, 4), (1, 0)]
    assert {a.allocated_at for a in allocations} == {request.approved_at}
    assert {(a.kind, a.product, a.profile_name, a.resource_name, a.compute_slices) for a in allocations} == {
        ("mig", "H100-80GB", "3g.40gb", "nvidia.com/mig-3g.40gb", 3)
    }
    assert (pool.project, pool.cluster.name, pool.tier, pool.tags, pool.state) == (
        request.project,
        "c1",
        "1",
        ["H100-80GB 3g.40gb", "llm"],
        "provisioning",
    )
    assert list(request.transitions.values_list("from_state", "to_state", "actor")) == [
        ("draft", "submitted", request.requested_by_id),
        ("submitted", "approved", operator.pk),
        ("approved", "provisioning", operator.pk),
    ]


def test_units_already_held_are_never_taken_again(fleet, make_request, operator):
    fleet.mig_node("n1", [THREE_THREE])
    first = services.approve(make_request(count=1), actor=operator)
    second = services.approve(make_request(count=1), actor=operator)
    ids = [a.mig_instance_id for a in Allocation.objects.filter(pool__in=[first, second])]
    assert len(set(ids)) == 2


def test_unhealthy_lost_and_unschedulable_capacity_is_withheld(fleet, make_request, operator):
    sick = fleet.mig_node("sick", [THREE_THREE, THREE_THREE])
    GpuCapacity.objects.filter(node=sick, index=0).update(health=GpuHealth.UNHEALTHY)
    GpuCapacity.objects.filter(node=sick, index=1).update(health=GpuHealth.LOST)
    cordoned = fleet.mig_node("cordoned", [THREE_THREE])
    NodeCapacity.objects.filter(pk=cordoned.pk).update(cordoned=True)
    notready = fleet.mig_node("notready", [THREE_THREE])
    NodeCapacity.objects.filter(pk=notready.pk).update(ready=False)
    healthy = fleet.mig_node("healthy", [["3g.40gb"]])
    pool = services.approve(make_request(count=1), actor=operator)
    assert pool.allocations.get().gpu.node == healthy
    with pytest.raises(InsufficientCapacity, match=r"^need 1 x H100-80GB 3g.40gb, 0 free"):
        services.approve(make_request(count=1), actor=operator)


def test_instances_with_running_workloads_are_not_free(fleet, make_request, operator, project):
    node = fleet.mig_node("n1", [THREE_THREE])
    busy = MigInstance.objects.get(gpu__node=node, placement_start=0)
    WorkloadProfile.objects.create(
        cluster=node.cluster,
        namespace="x",
        pod_name="p",
        pod_uid="u",
        node=node,
        gpu=busy.gpu,
        mig_instance=busy,
        resource_name="nvidia.com/mig-3g.40gb",
    )
    pool = services.approve(make_request(count=1), actor=operator)
    assert pool.allocations.get().mig_instance.placement_start == 4


def test_shortage_is_exact_and_leaves_nothing_behind(fleet, make_request, operator, django_capture_on_commit_callbacks):
    node = fleet.mig_node("n1", [THREE_THREE, ["3g.40gb", "1g.10gb", "1g.10gb"]])
    services.approve(make_request(count=2), actor=operator)
    request = make_request(count=2)
    with django_capture_on_commit_callbacks() as callbacks, pytest.raises(InsufficientCapacity) as caught:
        services.approve(request, actor=operator)
    gpu1 = GpuCapacity.objects.get(node=node, index=1).uuid
    assert caught.value.message == (
        f"need 2 x H100-80GB 3g.40gb, 1 free; reconfiguring GPUs {gpu1} on c1 would free 1 more (2 available)"
    )
    assert caught.value.detail["free_by_cluster"] == {"c1": 1}
    assert caught.value.detail["reconfiguration"]["gpus"] == [gpu1]
    assert callbacks == []
    request.refresh_from_db()
    assert (request.state, request.approved_at, request.approved_by) == ("submitted", None, None)
    assert not GpuPool.objects.filter(request=request).exists()
    assert PoolRequestTransition.objects.filter(request=request).count() == 1
    assert Allocation.objects.count() == 2


def test_no_reconfiguration_helps_when_every_gpu_is_held(fleet, make_request, operator):
    fleet.mig_node("n1", [THREE_THREE])
    services.approve(make_request(count=2), actor=operator)
    with pytest.raises(InsufficientCapacity) as caught:
        services.approve(make_request(count=1), actor=operator)
    assert caught.value.message == (
        "need 1 x H100-80GB 3g.40gb, 0 free; no MIG reconfiguration of idle GPUs would make room"
    )


def test_a_pool_never_spans_clusters(fleet, make_request, operator):
    fleet.mig_node("a1", [["3g.40gb"]], cluster="alpha")
    fleet.mig_node("b1", [["3g.40gb"]], cluster="beta")
    request = make_request(count=2)
    with pytest.raises(InsufficientCapacity) as caught:
        services.approve(request, actor=operator)
    assert caught.value.message.startswith(
        "need 2 x H100-80GB 3g.40gb on one cluster, at most 1 free on one (alpha), 2 free in all"
    )
    fleet.mig_node("b2", [["3g.40gb"]], cluster="beta")
    pool = services.approve(request, actor=operator)
    assert {a.gpu.node.cluster.name for a in pool.allocations.select_related("gpu__node__cluster")} == {"beta"}


def test_best_fit_cluster_and_operator_choice(fleet, make_request, operator):
    fleet.mig_node("a1", [THREE_THREE, THREE_THREE], cluster="alpha")
    fleet.mig_node("b1", [THREE_THREE], cluster="beta")
    assert services.approve(make_request(count=2), actor=operator).cluster.name == "beta"
    alpha = fleet.cluster("alpha")
    chosen = services.approve(make_request(count=1), actor=operator, cluster=alpha)
    assert chosen.cluster == alpha


def test_every_gpu_of_a_multi_gpu_pod_is_busy(fleet, make_request, operator):
    """A pod holding two GPUs is one WorkloadProfile row pointing at the first; the second is busy too."""
    train = fleet.full_node("train", gpus=3)
    first, second, third = GpuCapacity.objects.filter(node=train).order_by("index")
    WorkloadProfile.objects.create(
        cluster=train.cluster,
        namespace="x",
        pod_name="trainer",
        pod_uid="u2",
        node=train,
        gpu=first,
        device_ids=[first.uuid, second.uuid],
        count=2,
        resource_name="nvidia.com/gpu",
    )
    pool = services.approve(make_request(isolation="full", profile_name="", count=1), actor=operator)
    assert pool.allocations.get().gpu == third


def test_full_gpus_come_from_training_or_untiered_nodes_without_mig_or_sharing(fleet, make_request, operator):
    fleet.mig_node("mig", [["7g.80gb"]])
    fleet.timeslice_node("shared", gpus=2, replicas=4)
    fleet.full_node("dev", gpus=2, tier="3")
    train = fleet.full_node("train", gpus=2)
    pool = services.approve(make_request(isolation="full", profile_name="", count=2), actor=operator)
    assert [
        (a.gpu.node, a.gpu.index, a.kind, a.replica, a.resource_name, a.compute_slices)
        for a in pool.allocations.select_related("gpu__node")
    ] == [
        (train, 0, "full", 0, "nvidia.com/gpu", 7),
        (train, 1, "full", 0, "nvidia.com/gpu", 7),
    ]


def test_time_slice_replicas(fleet, make_request, operator):
    node = fleet.timeslice_node("shared", gpus=2, replicas=4)
    first = services.approve(make_request(isolation="timeslice", profile_name="", count=3), actor=operator)
    second = services.approve(make_request(isolation="timeslice", profile_name="", count=3), actor=operator)
    rows = Allocation.objects.filter(pool__in=[first, second]).order_by("pool_id", "id")
    assert [(a.pool_id, a.gpu.index, a.replica) for a in rows.select_related("gpu")] == [
        (first.pk, 0, 0),
        (first.pk, 0, 1),
        (first.pk, 0, 2),
        (second.pk, 0, 3),
        (second.pk, 1, 0),
        (second.pk, 1, 1),
    ]
    assert {a.gpu.node_id for a in rows} == {node.pk}
    assert {a.compute_slices for a in rows} == {2}
    with pytest.raises(InsufficientCapacity, match=r"^need 3 x H100-80GB time-slice replica, 2 free$"):
        services.approve(make_request(isolation="timeslice", profile_name="", count=3), actor=operator)


def test_only_submitted_requests_that_have_not_ended_are_approved(fleet, make_request, operator):
    fleet.mig_node("n1", [THREE_THREE])
    with pytest.raises(IllegalTransition):
        services.approve(make_request(state="draft"), actor=operator)
    ended = make_request()
    PoolRequest.objects.filter(pk=ended.pk).update(start_at="2020-01-01T00:00Z", end_at="2020-01-02T00:00Z")
    ended.refresh_from_db()
    with pytest.raises(DomainError, match="ended at 2020-01-02 00:00"):
        services.approve(ended, actor=operator)
    assert not GpuPool.objects.exists()

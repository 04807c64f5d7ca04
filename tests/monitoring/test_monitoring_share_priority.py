"""Share priorities on a time-sliced GPU (issue #30): operators give each time-sliced or MPS pool high, normal or
low priority; over-share enforcement evicts the lowest priority present on a GPU first, and a higher-priority pod
over its share is evicted only once no lower-priority pod there is over its share and not yet evicted."""

from datetime import timedelta

import pytest
from monitoring_helpers import T0

from capacity.adapters.nvml import GpuMetrics, ProcessInfo
from capacity.choices import SpecKind
from capacity.models import WorkloadProfile
from monitoring.models import ShareViolation
from monitoring.services.timeslice import check_shares
from pools.models import Allocation, GpuPool, PoolRequest

pytestmark = pytest.mark.django_db


def shared_pool(project, gpu, replica: int, priority: str) -> GpuPool:
    """A time-sliced pool of `project` holding replica `replica` of `gpu`, of share priority `priority`."""
    request = PoolRequest.objects.create(
        project=project, name=f"ts-{replica}", cluster=gpu.node.cluster, spec_kind=SpecKind.TIMESLICE
    )
    pool = GpuPool.objects.create(
        project=project,
        request=request,
        cluster=gpu.node.cluster,
        name=f"pool-{request.pk}",
        workload_type="development",
        share_priority=priority,
    )
    Allocation.objects.create(
        pool=pool,
        project=project,
        gpu=gpu,
        kind=SpecKind.TIMESLICE,
        replica=replica,
        resource_name="nvidia.com/gpu",
        product=gpu.catalog_product,
        allocated_at=T0 - timedelta(days=1),
    )
    return pool


def pod(gpu, n: int, project) -> WorkloadProfile:
    return WorkloadProfile.objects.create(
        cluster=gpu.node.cluster,
        namespace=project.namespace,
        pod_name=f"nb-{n}",
        pod_uid=f"uid-{n}",
        node=gpu.node,
        gpu=gpu,
        device_ids=[f"{gpu.uuid}::{n}"],
        resource_name="nvidia.com/gpu",
        project=project,
    )


@pytest.fixture
def three_projects(fleet, project, other_project):
    """The full H100 time-sliced 4 ways: team-a's pool is high, team-b's low, team-c's normal; one pod each."""
    from tenancy.models import Project

    third = Project.objects.create(name="Team C", slug="team-c", namespace="team-c")
    node = fleet.node
    node.timeslice_replicas = 4
    node.save()
    gpu = fleet.full_gpu
    for n, (owner, priority) in enumerate(((project, "high"), (other_project, "low"), (third, "normal"))):
        shared_pool(owner, gpu, n, priority)
        pod(gpu, n, owner)
    return fleet


def reading(gpu, **used_by_pod):
    processes = [
        ProcessInfo(pid=100 + i, used_memory_mib=mib, pod_uid=uid) for i, (uid, mib) in enumerate(used_by_pod.items())
    ]
    return GpuMetrics(index=gpu.index, uuid=gpu.uuid, memory_total_mib=81559, processes=processes)


def poll(fleet, at, **used) -> list[str]:
    """One share check; the pods whose eviction it enqueued (after commit), in order."""

    gpu = fleet.full_gpu
    with pytest.MonkeyPatch.context() as patch:
        sent: list[int] = []
        patch.setattr("monitoring.tasks.evict_over_share_task.delay_on_commit", sent.append)
        check_shares(fleet.node, [(gpu, reading(gpu, **used))], at=at)
    return [ShareViolation.objects.get(pk=pk).pod_name for pk in sent]


def test_the_lowest_priority_over_its_share_is_evicted_first(three_projects, settings):
    settings.MONITORING_EVICT_OVER_SHARE = True
    settings.MONITORING_SHARE_FACTOR_PCT = 150
    everyone_over = {"uid-0": 40000, "uid-1": 40000, "uid-2": 40000}
    assert poll(three_projects, T0, **everyone_over) == ["nb-1"]  # team-b, low
    rows = dict(ShareViolation.objects.values_list("pod_name", "share_priority"))
    assert rows == {"nb-0": "high", "nb-1": "low", "nb-2": "normal"}

    # The low pod is evicted (gone from the readings): normal is next, high still waits.
    ShareViolation.objects.filter(pod_name="nb-1").update(state="evicted")
    assert poll(three_projects, T0 + timedelta(seconds=30), **{"uid-0": 40000, "uid-2": 40000}) == ["nb-2"]
    ShareViolation.objects.filter(pod_name="nb-2").update(state="evicted")
    assert poll(three_projects, T0 + timedelta(seconds=60), **{"uid-0": 40000}) == ["nb-0"]


def test_a_high_priority_pod_alone_over_its_share_is_still_evicted(three_projects, settings):
    settings.MONITORING_EVICT_OVER_SHARE = True
    settings.MONITORING_SHARE_FACTOR_PCT = 150
    assert poll(three_projects, T0, **{"uid-0": 40000, "uid-1": 5000, "uid-2": 5000}) == ["nb-0"]


def test_a_pod_without_a_pool_on_the_gpu_goes_before_any_pool(three_projects, settings, other_project):
    settings.MONITORING_EVICT_OVER_SHARE = True
    settings.MONITORING_SHARE_FACTOR_PCT = 150
    gpu = three_projects.full_gpu
    Allocation.objects.filter(project=other_project).update(released_at=T0 - timedelta(hours=1))
    assert poll(three_projects, T0, **{"uid-1": 40000, "uid-2": 40000}) == ["nb-1"]
    assert ShareViolation.objects.get(pod_name="nb-1").share_priority == ""
    assert gpu.pk == ShareViolation.objects.get(pod_name="nb-1").gpu_id


def test_without_eviction_by_policy_nothing_is_enqueued_whatever_the_priority(three_projects, settings):
    settings.MONITORING_SHARE_FACTOR_PCT = 150
    assert poll(three_projects, T0, **{"uid-0": 40000, "uid-1": 40000}) == []
    assert ShareViolation.objects.count() == 2

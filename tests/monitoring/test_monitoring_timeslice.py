"""Time-sliced GPUs: a pod far above its memory share is flagged, resolved when back, evicted by policy."""

from datetime import timedelta

import pytest
from monitoring_helpers import T0

from capacity.adapters import kubernetes as kube
from capacity.adapters.nvml import GpuMetrics, ProcessInfo
from capacity.models import GpuCapacity, NodeCapacity, WorkloadProfile
from monitoring.choices import ShareState
from monitoring.models import ShareViolation
from monitoring.services.timeslice import check_node_shares, check_shares, evict_over_share, limit_mib

pytestmark = pytest.mark.django_db


@pytest.fixture
def shared(fleet, project):
    """The full H100 is time-sliced 4 ways; two pods of team-a run on it."""
    node = fleet.node
    node.timeslice_replicas = 4
    node.save()
    for n, uid in ((0, "uid-greedy"), (1, "uid-polite")):
        pod(fleet.full_gpu, n, uid, project)
    return fleet


def pod(gpu, n: int, uid: str, project) -> WorkloadProfile:
    """A running pod of team-a holding replica `n` of a time-sliced GPU."""
    return WorkloadProfile.objects.create(
        cluster=gpu.node.cluster,
        namespace="team-a",
        pod_name=f"nb-{n}",
        pod_uid=uid,
        node=gpu.node,
        gpu=gpu,
        device_ids=[f"{gpu.uuid}::{n}"],
        resource_name="nvidia.com/gpu",
        project=project,
    )


def reading(gpu, **used_by_pod):
    return GpuMetrics(
        index=gpu.index,
        uuid=gpu.uuid,
        memory_total_mib=81559,
        processes=[
            ProcessInfo(pid=100 + i, used_memory_mib=mib, pod_uid=uid)
            for i, (uid, mib) in enumerate(used_by_pod.items())
        ],
    )


def test_the_limit_is_the_share_times_the_factor(settings):
    settings.MONITORING_SHARE_FACTOR_PCT = 150
    assert limit_mib(81559, 4) == 20389 * 150 // 100


def test_a_pod_over_its_share_is_flagged_then_resolved(shared, settings, django_capture_on_commit_callbacks):
    settings.MONITORING_SHARE_FACTOR_PCT = 150
    gpu = shared.full_gpu
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert check_shares(shared.node, [(gpu, reading(gpu, **{"uid-greedy": 40000, "uid-polite": 9000}))], at=T0) == 1
    assert callbacks == []  # eviction is off by default
    violation = ShareViolation.objects.get()
    assert (violation.namespace, violation.pod_name, violation.used_mib, violation.share_mib, violation.replicas) == (
        "team-a",
        "nb-0",
        40000,
        20389,
        4,
    )
    assert violation.project.slug == "team-a"
    check_shares(shared.node, [(gpu, reading(gpu, **{"uid-greedy": 45000}))], at=T0 + timedelta(seconds=30))
    violation.refresh_from_db()
    assert (violation.used_mib, violation.last_seen_at, ShareViolation.objects.count()) == (
        45000,
        T0 + timedelta(seconds=30),
        1,
    )
    check_shares(shared.node, [(gpu, reading(gpu, **{"uid-greedy": 9000}))], at=T0 + timedelta(seconds=60))
    violation.refresh_from_db()
    assert (violation.state, violation.resolved_at) == (ShareState.RESOLVED, T0 + timedelta(seconds=60))


def test_eviction_by_policy_goes_through_the_eviction_api(
    shared, settings, monkeypatch, django_capture_on_commit_callbacks
):
    settings.MONITORING_EVICT_OVER_SHARE = True
    gpu = shared.full_gpu
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        check_shares(shared.node, [(gpu, reading(gpu, **{"uid-greedy": 70000}))], at=T0)
    assert len(callbacks) == 1
    evicted = []

    class FakeClient:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def evict_pod(self, namespace, name, grace_period_s=None):
            evicted.append((namespace, name))

    monkeypatch.setattr(kube.KubernetesClient, "for_cluster", classmethod(lambda cls, cluster: FakeClient()))
    violation = ShareViolation.objects.get()
    assert evict_over_share(violation.pk) == ShareState.EVICTED
    assert evicted == [("team-a", "nb-0")]
    assert evict_over_share(violation.pk) is None  # claimed once
    violation.refresh_from_db()
    assert violation.evicted_at is not None


def test_a_refused_eviction_is_recorded(shared, settings, monkeypatch):
    gpu = shared.full_gpu
    check_shares(shared.node, [(gpu, reading(gpu, **{"uid-greedy": 70000}))], at=T0)

    class Refusing:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def evict_pod(self, namespace, name, grace_period_s=None):
            raise kube.TooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", status=429)

    monkeypatch.setattr(kube.KubernetesClient, "for_cluster", classmethod(lambda cls, cluster: Refusing()))
    violation = ShareViolation.objects.get()
    assert evict_over_share(violation.pk) == ShareState.EVICTION_FAILED
    violation.refresh_from_db()
    assert violation.error.startswith("TooManyRequests: Cannot evict pod")


def test_a_single_pod_on_the_gpu_is_attributed_without_a_pod_uid(shared):
    WorkloadProfile.objects.filter(pod_uid="uid-polite").update(ended_at=T0)
    gpu = shared.full_gpu
    metrics = reading(gpu, **{"x": 50000})
    metrics.processes[0].pod_uid = None
    check_shares(shared.node, [(gpu, metrics)], at=T0)
    assert ShareViolation.objects.get().pod_uid == "uid-greedy"


def busy(gpu, **sm_by_pod):
    return GpuMetrics(
        index=gpu.index,
        uuid=gpu.uuid,
        memory_total_mib=81559,
        processes=[
            ProcessInfo(pid=200 + i, used_memory_mib=5000, pod_uid=uid, sm_util_pct=pct)
            for i, (uid, pct) in enumerate(sm_by_pod.items())
        ],
    )


def test_a_pod_over_its_compute_share_is_flagged_and_evicted_by_policy(
    shared, settings, django_capture_on_commit_callbacks
):
    settings.MONITORING_SHARE_FACTOR_PCT = 150  # 4 replicas: 25% each, over above 37%
    settings.MONITORING_EVICT_OVER_SHARE = True
    gpu = shared.full_gpu
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert check_shares(shared.node, [(gpu, busy(gpu, **{"uid-greedy": 90, "uid-polite": 20}))], at=T0) == 1
    violation = ShareViolation.objects.get()
    seen = (violation.pod_name, violation.over, violation.sm_util_pct, violation.used_mib)
    assert seen == ("nb-0", "compute", 90, 5000)
    assert [(cb.func.__self__.name, cb.args) for cb in callbacks] == [
        ("monitoring.tasks.evict_over_share_task", (violation.pk,))
    ]
    check_shares(shared.node, [(gpu, busy(gpu, **{"uid-greedy": 30}))], at=T0 + timedelta(seconds=30))
    violation.refresh_from_db()
    assert violation.state == ShareState.RESOLVED


def test_memory_and_compute_together(shared, settings):
    settings.MONITORING_SHARE_FACTOR_PCT = 150
    gpu = shared.full_gpu
    metrics = busy(gpu, **{"uid-greedy": 80})
    metrics.processes[0].used_memory_mib = 60000
    check_shares(shared.node, [(gpu, metrics)], at=T0)
    assert ShareViolation.objects.get().over == "memory+compute"


def test_a_batch_of_nodes_is_checked_with_three_reads_and_one_lock(
    shared, project, settings, django_assert_num_queries
):
    """The ingest worker's batch: every node's share check in one transaction, each node counted on its own."""
    settings.MONITORING_SHARE_FACTOR_PCT = 150
    gpu = shared.full_gpu
    other = NodeCapacity.objects.create(cluster=shared.cluster, name="gpu-node-02", gpu_count=1, timeslice_replicas=2)
    other_gpu = GpuCapacity.objects.create(node=other, index=0, uuid="GPU-0002-cccc", product="H100", memory_mib=81559)
    pod(other_gpu, 0, "uid-other", project)
    polls = [
        (shared.node, [(gpu, reading(gpu, **{"uid-greedy": 40000}))]),
        (other, [(other_gpu, reading(other_gpu, **{"uid-other": 70000}))]),
    ]
    # the workloads, the share priorities, the locked violations, an insert per new violation; the savepoint and
    # its release
    with django_assert_num_queries(1 + 1 + 1 + 2 + 2):
        assert check_node_shares(polls, at=T0) == {shared.node.pk: 1, other.pk: 1}
    assert sorted(ShareViolation.objects.values_list("gpu_id", "pod_uid", "replicas")) == sorted(
        [(gpu.pk, "uid-greedy", 4), (other_gpu.pk, "uid-other", 2)]
    )
    # One node back under its share: only its violation resolves.
    polls[0] = (shared.node, [(gpu, reading(gpu, **{"uid-greedy": 9000}))])
    assert check_node_shares(polls, at=T0 + timedelta(seconds=30)) == {shared.node.pk: 0, other.pk: 1}
    assert sorted(ShareViolation.objects.filter(resolved_at__isnull=True).values_list("pod_uid", flat=True)) == [
        "uid-other"
    ]

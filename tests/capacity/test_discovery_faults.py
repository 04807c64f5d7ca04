"""Discovery under every fault knob: failed lists write nothing, lost GPUs are kept, clusters are isolated."""

import pytest

from capacity.models import Cluster, DiscoveryRun, GpuCapacity, MigInstance, NodeCapacity, SpecAndCount
from capacity.services.discovery import discover_cluster
from capacity.tasks import discover_all_task, discover_cluster_task

pytestmark = pytest.mark.django_db

VANISHING = "prod-h100-full-02"


@pytest.fixture
def sim(simcluster, settings):
    settings.KUBERNETES_RETRIES = 2
    sim = simcluster("demo")
    sim.register()
    first = discover_cluster(sim.clusters["prod"].pk, inventory="inline")
    assert first.run.status == "succeeded"
    return sim


def present(sim):
    return set(NodeCapacity.objects.for_cluster(sim.clusters["prod"]).present().values_list("name", flat=True))


def refreshed(cluster) -> Cluster:
    cluster.refresh_from_db()
    return cluster


def test_api_500s_beyond_the_retries_fail_the_run_and_mark_nothing_gone(sim, retry_waits):
    before = refreshed(sim.clusters["prod"]).last_success_at
    sim.faults.node_vanish("prod", VANISHING)
    sim.faults.api_error(10, status=500, path_prefix="/api/v1/nodes")
    outcome = discover_cluster(sim.clusters["prod"].pk)
    assert outcome.run.status == "failed"
    assert outcome.run.error.startswith("Unavailable: list_node on http://")
    assert "500 InternalError" in outcome.run.error
    assert len(retry_waits) == 2
    assert VANISHING in present(sim) and len(present(sim)) == 6
    cluster = refreshed(sim.clusters["prod"])
    assert (cluster.status, cluster.last_success_at, cluster.last_error) == ("error", before, outcome.run.error)
    assert cluster.last_discovery_at > before


def test_a_failed_pod_list_fails_the_run_before_anything_is_written(sim, retry_waits):
    sim.faults.node_vanish("prod", VANISHING)
    sim.faults.api_error(10, status=503, path_prefix="/api/v1/pods", retry_after=1)
    outcome = discover_cluster(sim.clusters["prod"].pk)
    assert (outcome.run.status, retry_waits) == ("failed", [1.0, 1.0])
    assert VANISHING in present(sim)


def test_429_then_success(sim, retry_waits):
    sim.faults.api_error(1, status=429, retry_after=2, path_prefix="/api/v1/nodes")
    assert discover_cluster(sim.clusters["prod"].pk).run.status == "succeeded"
    assert retry_waits == [2.0]


def test_a_timeout_is_retried_and_the_run_succeeds(sim, settings, retry_waits):
    settings.KUBERNETES_TIMEOUT_S = 1
    sim.faults.api_timeout(1, seconds=2.0, path_prefix="/api/v1/nodes")
    assert discover_cluster(sim.clusters["prod"].pk).run.status == "succeeded"
    assert len(retry_waits) == 1


def test_a_failure_in_the_middle_of_a_paged_list_never_marks_nodes_gone(sim, settings, retry_waits):
    settings.KUBERNETES_PAGE_SIZE = 2
    sim.faults.node_vanish("prod", VANISHING)
    sim.faults.api_page_error(page=3, status=500, path_prefix="/api/v1/nodes", count=10)
    failed = discover_cluster(sim.clusters["prod"].pk)
    assert failed.run.status == "failed"
    assert VANISHING in present(sim) and len(present(sim)) == 6
    sim.faults.reset()
    sim.faults.node_vanish("prod", VANISHING)
    gone = discover_cluster(sim.clusters["prod"].pk)
    assert (gone.run.status, gone.run.nodes_gone) == ("succeeded", 1)
    assert VANISHING not in present(sim)


def test_an_expired_continue_token_restarts_the_list_and_the_run_succeeds(sim, settings, retry_waits):
    settings.KUBERNETES_PAGE_SIZE = 2
    sim.faults.api_page_error(page=2, status=410, path_prefix="/api/v1/nodes", count=1)
    outcome = discover_cluster(sim.clusters["prod"].pk)
    assert (outcome.run.status, outcome.run.nodes_seen, outcome.run.nodes_gone) == ("succeeded", 6, 0)


def test_node_vanishes_and_is_marked_gone_with_a_timestamp(sim, retry_waits):
    sim.faults.node_vanish("prod", VANISHING)
    outcome = discover_cluster(sim.clusters["prod"].pk)
    node = NodeCapacity.objects.get(name=VANISHING)
    assert (outcome.run.nodes_gone, outcome.run.nodes_seen) == (1, 5)
    assert outcome.run.started_at <= node.gone_at <= outcome.run.finished_at


def test_a_lost_gpu_is_marked_lost_not_deleted_and_comes_back_after_reset(sim, retry_waits):
    full = "prod-h100-full-01"
    sim.faults.gpu_lost("prod", full, 3)
    sim.faults.gpu_lost("prod", "prod-h100-bal-01", 5)
    outcome = discover_cluster(sim.clusters["prod"].pk, inventory="inline")
    assert outcome.inventory.gpus_lost == 2
    lost = GpuCapacity.objects.get(node__name=full, index=3)
    assert (lost.health, lost.lost_at is not None) == ("lost", True)
    assert GpuCapacity.objects.filter(node__name=full).count() == 8
    assert GpuCapacity.objects.filter(node__name=full).present().count() == 7
    assert SpecAndCount.objects.get(node__name=full).allocatable == 7  # the device plugin dropped it
    mig_gpu = GpuCapacity.objects.get(node__name="prod-h100-bal-01", index=5)
    assert set(mig_gpu.mig_instances.values_list("state", flat=True)) == {"gone"}
    assert MigInstance.objects.active().filter(gpu__node__name="prod-h100-bal-01").count() == 28

    sim.faults.reset()
    back = discover_cluster(sim.clusters["prod"].pk, inventory="inline")
    lost.refresh_from_db()
    assert (lost.health, lost.lost_at) == ("ok", None)
    assert back.inventory.gpus_lost == 0
    assert GpuCapacity.objects.filter(node__name=full).count() == 8


def test_one_failing_cluster_does_not_stop_the_others(
    sim, retry_waits, django_capture_on_commit_callbacks, monkeypatch
):
    queued = []
    monkeypatch.setattr(discover_cluster_task, "apply_async", lambda args, **kw: queued.append((args, kw)))
    with django_capture_on_commit_callbacks(execute=True):
        assert discover_all_task() == 2
    prod, dev = sim.clusters["prod"], sim.clusters["dev"]
    assert queued == [((prod.pk,), {"expires": 60}), ((dev.pk,), {"expires": 60})]

    sim.faults.api_error(50, status=500, cluster="prod")
    assert discover_cluster_task(prod.pk) == "failed"
    assert discover_cluster_task(dev.pk) == "succeeded"
    assert (refreshed(prod).status, refreshed(dev).status) == ("error", "ok")
    assert refreshed(dev).last_error == ""
    assert NodeCapacity.objects.for_cluster(dev).present().count() == 2
    assert DiscoveryRun.objects.filter(cluster=dev, status="succeeded").count() == 1


def test_a_task_for_a_deleted_cluster_does_nothing(db):
    assert discover_cluster_task(987654) is None

"""Beat fan-out: one NVML read per node on its agent's queue (expires = period), one DCGM scrape per exporter."""

from unittest import mock

import pytest
from django.utils import timezone

from capacity.adapters import kubernetes as kube
from capacity.models import Cluster, NodeCapacity
from monitoring import tasks
from monitoring.models import Collector, MaintenanceRun
from monitoring.services.collect import poll_slot

pytestmark = pytest.mark.django_db


def test_polls_go_to_each_nodes_queue_after_commit(fleet, settings, django_capture_on_commit_callbacks):
    settings.METRICS_INTERVAL_S = 30
    dcgm = Cluster.objects.create(name="c2", kubeconfig_path="/tmp/c2", dcgm_exporter_url="http://x:9400/metrics")
    NodeCapacity.objects.create(cluster=dcgm, name="dcgm-node", gpu_count=8)
    NodeCapacity.objects.create(cluster=fleet.cluster, name="gone-node", gpu_count=8, gone_at="2026-01-01T00:00Z")
    with (
        mock.patch.object(tasks.read_node_metrics_task, "apply_async") as poll,
        mock.patch.object(tasks.scrape_dcgm_task, "apply_async") as scrape,
        mock.patch.object(tasks.detect_trespass_task, "apply_async") as trespass,
        mock.patch.object(tasks.repoll_missing_task, "apply_async") as repoll,
        django_capture_on_commit_callbacks(execute=True),
    ):
        assert tasks.poll_metrics_task() == {"nodes": 1, "dcgm_clusters": 1, "trespass_checks": 2}
    ((args, kwargs),) = poll.call_args_list
    cluster, node, api_url, slot = args[0]
    assert (cluster, node, slot % 30) == ("c1", "gpu-node-01", 0)
    assert api_url == kube.api_url_for(fleet.cluster)  # the simulator's NVML factory is keyed by it
    assert kwargs == {"queue": "node.c1.gpu-node-01", "expires": 30}
    ((args, kwargs),) = scrape.call_args_list
    assert args[0][0] == dcgm.pk and kwargs == {"expires": 30}
    assert sorted(args[0][0] for args, _ in trespass.call_args_list) == sorted([fleet.cluster.pk, dcgm.pk])
    ((args, kwargs),) = repoll.call_args_list
    assert args == ((slot,),) and kwargs == {"countdown": settings.METRICS_REPOLL_AFTER_S, "expires": 30}


def test_the_repoll_asks_again_only_the_nodes_that_have_not_reported(fleet, settings):
    settings.METRICS_INTERVAL_S = 30
    other = NodeCapacity.objects.create(cluster=fleet.cluster, name="gpu-node-02", gpu_count=8)
    slot = int(poll_slot().timestamp())
    Collector.objects.create(  # gpu-node-01's report of this slot was ingested (a failed read counts)
        cluster=fleet.cluster, node=fleet.node, source="nvml", target=fleet.node.name, last_attempt_at=timezone.now()
    )
    with mock.patch.object(tasks.read_node_metrics_task, "apply_async") as poll:
        assert tasks.repoll_missing_task(slot) == 1
    ((args, kwargs),) = poll.call_args_list
    assert args[0][:2] == ("c1", other.name) and args[0][3] == slot
    assert kwargs == {"queue": "node.c1.gpu-node-02", "expires": 30 - settings.METRICS_REPOLL_AFTER_S}


def test_the_repoll_is_skipped_while_ingest_is_a_batch_behind(fleet, settings):
    settings.METRICS_INTERVAL_S, settings.AGENT_INGEST_BATCH = 30, 500
    slot = int(poll_slot().timestamp())
    with (
        mock.patch.object(tasks.read_node_metrics_task, "apply_async") as poll,
        mock.patch.object(tasks.transport, "backlog", return_value=500),
    ):
        assert tasks.repoll_missing_task(slot) == 0  # the missing node's report is likely in that queue
    assert poll.call_count == 0
    with (
        mock.patch.object(tasks.read_node_metrics_task, "apply_async") as poll,
        mock.patch.object(tasks.transport, "backlog", return_value=499),
    ):
        assert tasks.repoll_missing_task(slot) == 1
    assert poll.call_count == 1


def test_a_scrape_without_an_exporter_does_nothing(fleet):
    assert tasks.scrape_dcgm_task(fleet.cluster.pk) is None  # no exporter configured


def test_periodic_jobs_are_recorded(fleet):
    tasks.rollup_metrics_task()
    tasks.prune_metrics_task()
    tasks.detect_idle_reservations_task()
    runs = list(MaintenanceRun.objects.order_by("started_at").values_list("job", "status"))
    assert runs == [("rollup", "succeeded"), ("retention", "succeeded"), ("idle", "succeeded")]

"""Beat fan-out: one NVML read per node on its agent's queue (expires = period), one DCGM scrape per exporter."""

from unittest import mock

import pytest

from capacity.adapters import kubernetes as kube
from capacity.models import Cluster, NodeCapacity
from monitoring import tasks
from monitoring.models import MaintenanceRun

pytestmark = pytest.mark.django_db


def test_polls_go_to_each_nodes_queue_after_commit(fleet, settings, django_capture_on_commit_callbacks):
    settings.METRICS_INTERVAL_S = 30
    dcgm = Cluster.objects.create(name="c2", kubeconfig_path="/tmp/c2", dcgm_exporter_url="http://x:9400/metrics")
    NodeCapacity.objects.create(cluster=dcgm, name="dcgm-node", gpu_count=8)
    NodeCapacity.objects.create(cluster=fleet.cluster, name="gone-node", gpu_count=8, gone_at="2026-01-01T00:00Z")
    with (
        mock.patch.object(tasks.read_node_metrics_task, "apply_async") as poll,
        mock.patch.object(tasks.scrape_dcgm_task, "apply_async") as scrape,
        django_capture_on_commit_callbacks(execute=True),
    ):
        assert tasks.poll_metrics_task() == {"nodes": 1, "dcgm_clusters": 1}
    ((args, kwargs),) = poll.call_args_list
    cluster, node, api_url, slot = args[0]
    assert (cluster, node, slot % 30) == ("c1", "gpu-node-01", 0)
    assert api_url == kube.api_url_for(fleet.cluster)  # the simulator's NVML factory is keyed by it
    assert kwargs == {"queue": "node.c1.gpu-node-01", "expires": 30}
    ((args, kwargs),) = scrape.call_args_list
    assert args[0][0] == dcgm.pk and kwargs == {"expires": 30}


def test_a_scrape_without_an_exporter_does_nothing(fleet):
    assert tasks.scrape_dcgm_task(fleet.cluster.pk) is None  # no exporter configured


def test_periodic_jobs_are_recorded(fleet):
    tasks.rollup_metrics_task()
    tasks.prune_metrics_task()
    tasks.detect_idle_reservations_task()
    runs = list(MaintenanceRun.objects.order_by("started_at").values_list("job", "status"))
    assert runs == [("rollup", "succeeded"), ("retention", "succeeded"), ("idle", "succeeded")]

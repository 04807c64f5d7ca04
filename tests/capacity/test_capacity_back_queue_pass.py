"""Capacity that comes back gets the queue a pass after commit, not only on the beat (docs/queue.md):
a node listed again, Ready again or uncordoned (discovery), and a MIG reconfiguration done."""

from unittest import mock

import pytest
from django.utils import timezone
from reconfig_sim import drive, node_row, start_sim

from capacity.adapters.kubernetes import parse_node
from capacity.models import Cluster
from capacity.services.discovery import sync_cluster
from operations import reconfiguration as rc
from scheduling.tasks import process_queue_task

pytestmark = pytest.mark.django_db


def gpu_node(*, ready="True", unschedulable=False, rv="1", name="gpu-1"):
    return parse_node(
        {
            "metadata": {
                "name": name,
                "uid": f"u-{name}",
                "resourceVersion": rv,
                "labels": {"nvidia.com/gpu.count": "8"},
            },
            "spec": {"unschedulable": True} if unschedulable else {},
            "status": {"capacity": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": ready}]},
        }
    )


@pytest.mark.parametrize(
    ("before", "after", "passes"),
    [
        ([gpu_node(ready="False")], [gpu_node(rv="2")], 1),  # Ready again
        ([gpu_node(unschedulable=True)], [gpu_node(rv="2")], 1),  # uncordoned
        ([], [gpu_node(rv="2")], 1),  # listed again after it was gone
        ([gpu_node()], [gpu_node(ready="False", rv="2")], 0),  # going away frees nothing
        ([gpu_node()], [gpu_node(rv="2"), gpu_node(name="gpu-2")], 0),  # a new node: inventory's business
    ],
)
def test_a_node_that_comes_back_gets_the_queue_a_pass_after_commit(
    before, after, passes, django_capture_on_commit_callbacks
):
    cluster = Cluster.objects.create(name="c1", kubeconfig_path="/tmp/c1.kubeconfig")
    with mock.patch("capacity.tasks.enqueue_inventory"):
        sync_cluster(cluster.pk, [gpu_node(rv="0")], [], listed_at=timezone.now())
        sync_cluster(cluster.pk, before, [], listed_at=timezone.now())
        with mock.patch.object(process_queue_task, "delay") as delay:
            with django_capture_on_commit_callbacks(execute=False) as callbacks:
                sync_cluster(cluster.pk, after, [], listed_at=timezone.now())
            assert delay.call_count == 0  # not before commit
            for callback in callbacks:
                callback()
    assert delay.call_count == passes


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 1, {0: ["7g.80gb"]}, "")])
    yield sim
    sim.server.stop()


def test_a_finished_reconfiguration_gets_the_queue_a_pass_after_commit(sim):
    reconf = rc.create(node_row("gpu-a"), {"0": ["3g.40gb", "3g.40gb"]}, force=True)
    with mock.patch.object(process_queue_task, "delay_on_commit") as enqueued:
        outcomes = drive(sim, reconf)
    assert reconf.state == "succeeded", reconf.error
    assert outcomes[-1] == "uncordon:advanced"
    enqueued.assert_called_once_with()

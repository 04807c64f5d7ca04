"""MIG reconfiguration against pods that take time (#14 item 5): a drained pod stays Terminating for
its grace period, holding its devices, and a new pod sits in ContainerCreating before Running."""

import pytest
from reconfig_sim import drive, node_row, start_sim

from capacity.adapters.kubernetes import KubernetesClient
from operations import reconfiguration as rc
from operations.tasks import reconfiguration_step_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"], 1: ["7g.80gb"]}, "")])
    sim.state.api.pod_start_delay_s = 3600  # started only when a test runs the kubelet
    sim.state.api.pod_termination_grace_s = 3600
    yield sim
    sim.server.stop()


def test_drain_waits_while_an_evicted_pod_is_terminating_and_does_not_evict_it_again(sim):
    sim.add_gpu_pod("gpu-a", "trainer", "nvidia.com/mig-7g.80gb")
    sim.state.run_kubelet()  # Running
    reconf = rc.create(node_row("gpu-a"), {"0": ["7g.80gb"]}, drain=True, force=True)
    for step in ("plan", "check", "cordon"):
        assert reconfiguration_step_task(reconf.pk, step) == "advanced"

    assert reconfiguration_step_task(reconf.pk, "drain") == "waiting"
    pod = sim.sim_cluster.pods[("team-a", "trainer")].obj
    assert pod["metadata"]["deletionTimestamp"] and pod["status"]["phase"] == "Running"
    terminating_since = pod["metadata"]["resourceVersion"]
    assert reconfiguration_step_task(reconf.pk, "drain") == "waiting"
    assert sim.sim_cluster.pods[("team-a", "trainer")].obj["metadata"]["resourceVersion"] == terminating_since
    reconf.refresh_from_db()
    assert reconf.steps.filter(step="drain", event="waiting").first().message == (
        "1 GPU pod(s) still running, evicting: team-a/trainer"
    )

    sim.state.run_kubelet()  # the grace period is over: the pod is gone
    assert ("team-a", "trainer") not in sim.sim_cluster.pods
    assert reconfiguration_step_task(reconf.pk, "drain") == "advanced"
    drive(sim, reconf)
    assert reconf.state == "succeeded", reconf.error
    assert sim.layout("gpu-a", 0) == [("7g.80gb", 0)]


def test_a_container_creating_pod_holds_the_operator_path_like_a_running_one(sim):
    sim.add_gpu_pod("gpu-a", "starting", "nvidia.com/mig-3g.40gb")
    with KubernetesClient.from_kubeconfig(sim.cluster.kubeconfig_path) as client:
        (pod,) = [p for p in client.list_pods_on_node("gpu-a") if p.name == "starting"]  # not the device plugin's
    assert pod.phase == "Pending" and not pod.finished and pod.node_name == "gpu-a"

    reconf = rc.create(node_row("gpu-a"), {"1": ["3g.40gb", "3g.40gb"]}, force=True)
    for step in ("plan", "check", "cordon"):
        assert reconfiguration_step_task(reconf.pk, step) == "advanced"
    assert reconfiguration_step_task(reconf.pk, "drain") == "waiting"

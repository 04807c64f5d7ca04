"""Which pod holds which device: the kubelet's PodResources API, read by the node agent with each inventory.

The simulator serves each node's `v1.PodResourcesLister` on a unix socket from the devices its kubelet handed out;
the agent's adapter (capacity.adapters.podresources) reads it over gRPC; the inventory ingest stores every device
of every pod. No pod annotation is read (a lying one changes nothing).
"""

from __future__ import annotations

import copy

import pytest
from django.test import override_settings
from django.utils import timezone
from sim_pods import run_gpu_pod

from capacity.adapters import podresources
from capacity.agent import node as agent
from capacity.agent import protocol
from capacity.models import GpuCapacity, NodeCapacity, WorkloadProfile
from capacity.services.discovery import discover_cluster
from capacity.services.inventory import ingest_inventory_reports, inventory_node
from pools.models import Allocation, GpuPool, PoolRequest
from simcluster.scheduler import assigned_devices
from tenancy.models import Project

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("retry_waits")]

FULL_NODE = "prod-h100-full-01"  # the demo's two 2-GPU llm-train pods of team-nlp hold its four GPUs


@pytest.fixture
def sim(simcluster):
    sim = simcluster("demo")
    sim.register("prod")
    return sim


@pytest.fixture
def nlp(db):
    return Project.objects.create(name="NLP", slug="nlp", namespace="team-nlp")


def truth(sim, namespace, name):
    with sim.state.lock:
        return assigned_devices(sim.state.cluster("prod"), namespace, name)


def set_mode(sim, node, mode):
    sim.state.cluster("prod").nodes[node].pod_resources = mode
    sim.server.pod_resources.sync()


def discover(sim, inventory="inline"):
    outcome = discover_cluster(sim.clusters["prod"].pk, inventory=inventory)
    assert outcome.run.status == "succeeded", outcome.run.error
    return outcome


def test_the_adapter_reads_what_the_simulated_kubelet_handed_out(sim):
    reading = podresources.read_node(sim.url("prod"), FULL_NODE)
    assert (reading.error, reading.warnings) == ("", [])
    assert {(p.namespace, p.name): p.devices for p in reading.pods} == {
        ("team-nlp", "llm-train-0"): {"nvidia.com/gpu": truth(sim, "team-nlp", "llm-train-0")},
        ("team-nlp", "llm-train-1"): {"nvidia.com/gpu": truth(sim, "team-nlp", "llm-train-1")},
    }
    gpus = sorted(g.uuid for g in sim.state.cluster("prod").nodes[FULL_NODE].gpus)
    assert sorted(reading.allocatable["nvidia.com/gpu"]) == gpus


@pytest.mark.parametrize(
    ("mode", "error", "warnings"),
    [
        ("missing", "missing: ", []),
        ("denied", "permission denied: ", []),
        ("old-kubelet", "", ["GetAllocatableResources: unimplemented (kubelet before 1.23, or "]),
    ],
)
def test_a_kubelet_that_cannot_answer_is_a_value_not_an_exception(sim, mode, error, warnings):
    set_mode(sim, FULL_NODE, mode)
    reading = podresources.read_node(sim.url("prod"), FULL_NODE)
    assert reading.error.startswith(error) if error else reading.error == ""
    assert [w[: len(p)] for w, p in zip(reading.warnings, warnings, strict=True)] == warnings
    if mode == "old-kubelet":  # List still answers
        assert reading.allocatable is None and len(reading.pods) == 2


def test_every_pod_gets_every_device_its_kubelet_lists_and_no_annotation_is_read(sim, nlp):
    lie = truth(sim, "team-vision", "tracker")[0]
    with sim.state.lock:  # an annotation naming another device: product code must not believe it
        record = sim.state.cluster("prod").pods[("team-nlp", "llm-train-0")]
        record.obj["metadata"].setdefault("annotations", {})["gpuaas.io/device-ids"] = lie
        record.raw = None
    discover(sim)
    rows = {w.pod_name: w for w in WorkloadProfile.objects.running().select_related("gpu", "mig_instance")}
    for name in ("llm-train-0", "llm-train-1"):
        assert rows[name].device_ids == truth(sim, "team-nlp", name)
        assert rows[name].gpu.uuid == truth(sim, "team-nlp", name)[0] and rows[name].project == nlp
    (tracker,) = truth(sim, "team-vision", "tracker")
    assert rows["tracker"].device_ids == [tracker] and rows["tracker"].mig_instance.uuid == tracker


def _hold(project, uuids):
    """A pool of `project` holding these whole GPUs (rows written as approval would): the demo's nlp-training."""
    gpus = list(GpuCapacity.objects.filter(uuid__in=uuids).order_by("index"))
    cluster = gpus[0].node.cluster
    request = PoolRequest.objects.create(
        project=project, cluster=cluster, product="H100-80GB", state="active", count=len(gpus),
        approved_at=timezone.now(),
    )  # fmt: skip
    pool = GpuPool.objects.create(
        project=project, request=request, cluster=cluster, name="nlp-training", workload_type="training",
        state="active",
    )  # fmt: skip
    Allocation.objects.bulk_create(
        Allocation(
            pool=pool,
            project=project,
            kind="full",
            gpu=gpu,
            resource_name="nvidia.com/gpu",
            product="H100-80GB",
            compute_slices=7,
        )  # fmt: skip
        for gpu in gpus
    )
    return pool


def test_two_pods_of_two_gpus_hold_all_four_units_in_use(sim, nlp):
    discover(sim)
    held = truth(sim, "team-nlp", "llm-train-0") + truth(sim, "team-nlp", "llm-train-1")
    pool = _hold(nlp, held)
    busy = Allocation.objects.active().filter(pool=pool).in_use()
    assert sorted(busy.values_list("gpu__uuid", flat=True)) == sorted(held)
    card = GpuPool.objects.get(pk=pool.pk).card()
    assert (card["allocation"], card["gpus_touched_in_use"]) == ("4/4", 4), card


def test_discovery_asks_the_kubelet_on_every_binding_not_only_on_node_changes(sim, nlp):
    discover(sim)
    run_gpu_pod(sim.state, sim.state.cluster("prod"), "team-nlp", "late", node="prod-h100-full-02",
                resource="nvidia.com/gpu")  # fmt: skip
    outcome = discover(sim, inventory="none")  # the node itself did not change
    late = WorkloadProfile.objects.get(pod_name="late")
    assert late.device_ids == [] and outcome.sync.inventory_nodes == ["prod-h100-full-02"]
    result = inventory_node(sim.clusters["prod"].pk, "prod-h100-full-02")
    late.refresh_from_db()
    assert (late.device_ids, result.workloads_attributed, result.workloads_resolved) == (
        truth(sim, "team-nlp", "late"),
        1,
        0,
    )
    assert discover(sim, inventory="none").sync.inventory_nodes == []  # nothing left to attribute


def test_a_kubelet_without_the_socket_leaves_attribution_to_nvml_and_says_so(sim):
    set_mode(sim, FULL_NODE, "missing")
    discover(sim, inventory="none")
    result = inventory_node(sim.clusters["prod"].pk, FULL_NODE)
    node = NodeCapacity.objects.get(name=FULL_NODE)
    assert (
        node.inventory_error == f"kubelet PodResources: missing: {podresources.socket_for(sim.url('prod'), FULL_NODE)}"
    )
    assert result.workloads_attributed == 0 and result.workloads_resolved == 2  # NVML: the first device only
    assert result.warnings[FULL_NODE][0].startswith("kubelet PodResources: missing")
    set_mode(sim, FULL_NODE, "ok")
    inventory_node(sim.clusters["prod"].pk, FULL_NODE)
    node.refresh_from_db()
    assert node.inventory_error == ""
    train = WorkloadProfile.objects.get(pod_name="llm-train-0")
    assert train.device_ids == truth(sim, "team-nlp", "llm-train-0")


def test_the_inventory_report_carries_pod_resources_and_is_checked(sim):
    discover(sim, inventory="none")
    report = agent.read_inventory("prod", FULL_NODE, api_url=sim.url("prod"))
    reading = protocol.pod_resources_from_body(report["body"])
    assert {p.name for p in reading.pods} == {"llm-train-0", "llm-train-1"}
    results, refused = ingest_inventory_reports([report])
    assert refused == [] and results["prod"].workloads_attributed == 2

    old = copy.deepcopy(report)  # an agent of the previous version sends no pod_resources: still read
    del old["body"]["pod_resources"]
    old = protocol.sign(protocol.KIND_INVENTORY, "prod", FULL_NODE, old["slot"], old["body"])
    assert protocol.pod_resources_from_body(old["body"]) is None
    assert ingest_inventory_reports([old])[1] == []

    bad = copy.deepcopy(report["body"])
    bad["pod_resources"]["pods"][0]["devices"] = {"nvidia.com/gpu": "GPU-1"}
    forged = protocol.sign(protocol.KIND_INVENTORY, "prod", FULL_NODE, report["slot"], bad)
    results, refused = ingest_inventory_reports([forged])
    assert results == {} and "devices must map resource names to lists" in refused[0]


@override_settings(PODRESOURCES_SOCKET="/var/lib/kubelet/pod-resources/kubelet.sock")
def test_a_real_agent_asks_its_own_nodes_kubelet():
    assert podresources.socket_for("https://k8s.example:6443", "any-node") == (
        "/var/lib/kubelet/pod-resources/kubelet.sock"
    )


def test_dcgm_exporters_pod_labels_are_the_second_source(sim, nlp):
    from monitoring.services.collect import scrape_cluster

    set_mode(sim, FULL_NODE, "missing")  # gpuaas' agent cannot ask this kubelet; dcgm-exporter could
    discover(sim, inventory="none")
    cluster = sim.clusters["prod"]
    cluster.dcgm_exporter_url = ", ".join(sim.server.dcgm_exporter_urls("prod"))
    cluster.save(update_fields=["dcgm_exporter_url"])
    inventory_node(cluster.pk, FULL_NODE)  # GPU rows exist; NVML names each pod's first GPU only
    assert WorkloadProfile.objects.get(pod_name="llm-train-0").device_ids == []

    scrape_cluster(cluster.pk)

    rows = {w.pod_name: w for w in WorkloadProfile.objects.running().select_related("gpu")}
    for name in ("llm-train-0", "llm-train-1"):
        assert sorted(rows[name].device_ids) == sorted(truth(sim, "team-nlp", name))
    pool = _hold(nlp, truth(sim, "team-nlp", "llm-train-0") + truth(sim, "team-nlp", "llm-train-1"))
    assert Allocation.objects.active().filter(pool=pool).in_use().count() == 4


def test_members_see_which_of_their_pods_used_which_unit_and_how_hard(sim, nlp, django_user_model, charlie):
    from datetime import timedelta

    from rest_framework.test import APIClient

    from monitoring.services.reports import poll_node
    from tenancy.roles import set_role

    discover(sim)
    pool = _hold(nlp, truth(sim, "team-nlp", "llm-train-0") + truth(sim, "team-nlp", "llm-train-1"))
    Allocation.objects.filter(pool=pool).update(allocated_at=timezone.now() - timedelta(hours=1))
    WorkloadProfile.objects.update(started_at=timezone.now() - timedelta(minutes=30))
    node = NodeCapacity.objects.get(name=FULL_NODE)
    for minutes in (3, 2, 1):
        poll_node(node.pk, at=timezone.now() - timedelta(minutes=minutes))
    member = django_user_model.objects.create_user("nina", "nina@example.com", "pw-nina-1")
    set_role(nlp, member, "member")
    client = APIClient()
    client.force_authenticate(member)
    start = (timezone.now() - timedelta(hours=2)).isoformat().replace("+00:00", "Z")

    body = client.get(f"/api/v1/monitoring/pools/{pool.pk}/", {"start": start, "step": "raw"}).json()

    pods = {p["pod"]: p for p in body["pods"]}
    assert set(pods) == {"llm-train-0", "llm-train-1"}
    for name, pod in pods.items():
        assert [u["uuid"] for u in pod["units"]] == truth(sim, "team-nlp", name)  # every device, kubelet's order
        assert all(u["sm_active_avg"] is not None and u["sm_active_avg"] > 0 for u in pod["units"]), pod
    outsider = APIClient()
    outsider.force_authenticate(charlie)
    assert outsider.get(f"/api/v1/monitoring/pools/{pool.pk}/", {"start": start}).status_code == 404


def test_a_trespass_is_seen_at_the_next_poll_not_the_next_discovery(
    sim, monkeypatch, django_capture_on_commit_callbacks
):
    """The metrics poll reads PodResources `List` and sends its fingerprint; a changed one queues the cluster's
    discovery at once, so the next trespass check (one poll later) has the pod: exactly one event."""
    import json
    import urllib.request

    from monitoring.models import TrespassEvent
    from monitoring.services import reports
    from monitoring.services.reports import poll_node
    from monitoring.services.trespass import detect_trespass

    discover(sim)
    cluster_id = sim.clusters["prod"].pk
    node = NodeCapacity.objects.get(name="prod-h100-full-02")
    queued = []
    monkeypatch.setattr(reports, "queue_discovery", queued.append)
    with django_capture_on_commit_callbacks(execute=True):
        poll_node(node.pk)  # the node's first fingerprint: stored, nothing queued
        poll_node(node.pk)  # unchanged: nothing queued
    node.refresh_from_db()
    assert node.pods_digest and queued == []

    url = sim.server.cluster_url("prod") + "/sim/v1/faults"
    body = json.dumps({"fault": "trespass", "node": node.name, "pod": "miner"}).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        injected = json.loads(response.read())
    with django_capture_on_commit_callbacks(execute=True):
        poll_node(node.pk)
    assert queued == [cluster_id]  # one discovery, queued by the poll that saw the new pod
    assert not WorkloadProfile.objects.filter(pod_name="miner").exists()  # the last discovery did not see it

    discover(sim)  # what the queued discover_cluster_task runs (the node agent's inventory inline here)
    detect_trespass(cluster_id)
    (event,) = TrespassEvent.objects.filter(namespace="intruder")
    assert (event.kind, event.pod_name, event.gpu.uuid) == ("unallocated_pod", "miner", injected["devices"][0])
    with django_capture_on_commit_callbacks(execute=True):
        poll_node(node.pk)  # the set is as stored now: nothing more queued
    discover(sim)  # the periodic discovery afterwards: the same pod, the same event
    detect_trespass(cluster_id)
    assert queued == [cluster_id]
    assert list(TrespassEvent.objects.filter(namespace="intruder").values_list("pk", "ended_at")) == [(event.pk, None)]


def test_new_devices_from_the_kubelet_queue_a_trespass_check_at_once(
    sim, monkeypatch, django_capture_on_commit_callbacks
):
    """Attribution that changes a pod's devices checks the cluster for trespass after commit (monitoring connects
    capacity.signals.workloads_attributed), so the event does not wait for the next poll's check; attribution
    that changes nothing queues nothing."""
    import json
    import urllib.request

    from monitoring import tasks

    checks = []
    monkeypatch.setattr(tasks.detect_trespass_task, "delay", checks.append)
    cluster_id = sim.clusters["prod"].pk
    with django_capture_on_commit_callbacks(execute=True):
        discover(sim)  # the demo's own pods get their devices: one check
    assert checks == [cluster_id]
    with django_capture_on_commit_callbacks(execute=True):
        discover(sim)  # nothing changed: no check
    assert checks == [cluster_id]

    url = sim.server.cluster_url("prod") + "/sim/v1/faults"
    body = json.dumps({"fault": "trespass", "node": "prod-h100-full-02", "pod": "miner"}).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request).close()
    with django_capture_on_commit_callbacks(execute=True):
        discover(sim)  # the queued discovery: the miner's device attributed, the cluster checked at once
    assert checks == [cluster_id, cluster_id]

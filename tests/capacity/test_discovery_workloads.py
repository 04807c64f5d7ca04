"""Workload tracking (the seed's Profile): GPU pods become WorkloadProfile rows on their GPU or MIG instance."""

import pytest

from capacity.models import GpuCapacity, MigInstance, NodeCapacity, WorkloadProfile
from capacity.services.discovery import discover_cluster
from capacity.services.inventory import inventory_node
from simcluster.scheduler import assigned_devices
from tenancy.models import Project

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("retry_waits")]


@pytest.fixture
def sim(simcluster):
    sim = simcluster("demo")
    sim.register("prod")
    return sim


@pytest.fixture
def vision(db):
    return Project.objects.create(name="Vision", slug="vision", namespace="team-vision")


def sim_pod(sim, namespace, name):
    return sim.state.cluster("prod").pods[(namespace, name)]


def device_ids(sim, namespace, name):
    """The devices the simulated kubelet gave the pod (what its PodResources socket lists)."""
    with sim.state.lock:
        return assigned_devices(sim.state.cluster("prod"), namespace, name)


def discover(sim, inventory="inline"):
    outcome = discover_cluster(sim.clusters["prod"].pk, inventory=inventory)
    assert outcome.run.status == "succeeded", outcome.run.error
    return outcome


def test_pods_map_to_their_mig_instance_gpu_and_project(sim, vision):
    discover(sim)
    tracker = WorkloadProfile.objects.select_related("mig_instance__profile", "node", "gpu").get(pod_name="tracker")
    (mig_uuid,) = device_ids(sim, "team-vision", "tracker")
    assert (tracker.namespace, tracker.resource_name, tracker.count, tracker.project) == (
        "team-vision",
        "nvidia.com/mig-3g.40gb",
        1,
        vision,
    )
    assert (tracker.mig_instance.uuid, tracker.mig_instance.profile.name) == (mig_uuid, "3g.40gb")
    assert tracker.gpu == tracker.mig_instance.gpu
    assert tracker.node == tracker.gpu.node
    assert tracker.device_ids == [mig_uuid]
    assert tracker.ended_at is None

    train = WorkloadProfile.objects.select_related("gpu").get(pod_name="llm-train-0")
    uuids = device_ids(sim, "team-nlp", "llm-train-0")
    assert (train.resource_name, train.count, train.project, train.mig_instance) == ("nvidia.com/gpu", 2, None, None)
    assert (train.device_ids, train.gpu.uuid) == (uuids, uuids[0])


def test_the_node_agent_fills_in_devices_discovery_could_not_resolve_yet(sim, vision):
    outcome = discover(sim, inventory="none")  # Kubernetes only: the pod's devices are its kubelet's to tell
    detector = WorkloadProfile.objects.get(pod_name="detector")
    assert (detector.gpu_id, detector.mig_instance_id, detector.device_ids) == (None, None, [])
    assert detector.node.name in outcome.sync.inventory_nodes  # its node's agent is asked next
    result = inventory_node(sim.clusters["prod"].pk, detector.node.name)
    detector.refresh_from_db()
    assert detector.device_ids == device_ids(sim, "team-vision", "detector")
    assert detector.mig_instance == MigInstance.objects.get(uuid=detector.device_ids[0])
    assert result.workloads_attributed == 1


def test_nvml_processes_identify_the_device_when_the_kubelet_cannot_be_asked(sim):
    segmenter_node = sim_pod(sim, "team-vision", "segmenter").obj["spec"]["nodeName"]
    sim.state.cluster("prod").nodes[segmenter_node].pod_resources = "missing"
    sim.server.pod_resources.sync()
    (uuid,) = device_ids(sim, "team-vision", "segmenter")
    discover(sim, inventory="none")
    segmenter = WorkloadProfile.objects.get(pod_name="segmenter")
    assert (segmenter.device_ids, segmenter.mig_instance_id) == ([], None)
    result = inventory_node(sim.clusters["prod"].pk, segmenter.node.name)
    segmenter.refresh_from_db()
    on_node = WorkloadProfile.objects.filter(node=segmenter.node).running()
    assert result.workloads_resolved == on_node.count() == on_node.filter(mig_instance__isnull=False).count()
    assert segmenter.mig_instance.uuid == uuid
    assert result.workloads_attributed == 0
    assert segmenter.node.__class__.objects.get(pk=segmenter.node_id).inventory_error.startswith(
        "kubelet PodResources: missing"
    )


def test_a_deleted_or_finished_pod_ends_its_row_which_stays(sim, vision):
    discover(sim)
    with sim.state.lock:
        finished = sim_pod(sim, "team-vision", "detector")
        finished.obj["status"]["phase"] = "Succeeded"
        finished.raw = None
    from capacity.adapters.kubernetes import KubernetesClient

    with KubernetesClient.from_kubeconfig(str(sim.kubeconfigs["prod"])) as k:
        k.delete_pod("team-vision", "tracker")
    outcome = discover(sim)
    assert outcome.sync.workloads.ended == 2
    ended = dict(WorkloadProfile.objects.filter(ended_at__isnull=False).values_list("pod_name", "ended_at"))
    assert set(ended) == {"detector", "tracker"}
    assert WorkloadProfile.objects.count() == 5
    assert WorkloadProfile.objects.get(pod_name="tracker").mig_instance is not None  # history keeps the device
    again = discover(sim)
    assert (again.sync.workloads.created, again.sync.workloads.ended) == (0, 0)
    assert dict(WorkloadProfile.objects.filter(ended_at__isnull=False).values_list("pod_name", "ended_at")) == ended


def test_a_vanished_node_is_gone_but_its_gpus_and_workload_history_stay(sim):
    discover(sim)
    node = NodeCapacity.objects.get(name="prod-h100-full-01")
    gpus = set(GpuCapacity.objects.filter(node=node).values_list("uuid", flat=True))
    sim.faults.node_vanish("prod", "prod-h100-full-01")  # its pods are garbage-collected with it
    outcome = discover(sim)
    node.refresh_from_db()
    assert outcome.sync.nodes_gone == outcome.run.nodes_gone == 1
    assert node.gone_at is not None
    assert set(GpuCapacity.objects.filter(node=node).values_list("uuid", flat=True)) == gpus
    trains = WorkloadProfile.objects.filter(pod_name__startswith="llm-train")
    assert [(w.node_id, w.ended_at is not None) for w in trains] == [(node.pk, True), (node.pk, True)]
    assert not GpuCapacity.objects.for_cluster(sim.clusters["prod"]).present().filter(node=node).exists()


def _hold(project, instance):
    """A pool of `project` that holds `instance` (rows written directly, as approval would)."""
    from django.utils import timezone

    from pools.models import Allocation, GpuPool, PoolRequest

    cluster = instance.gpu.node.cluster
    request = PoolRequest.objects.create(
        project=project, name="held", cluster=cluster, product="H100-80GB", spec_kind="mig", isolation="mig",
        profile_name=instance.profile.name, count=1, state="active", approved_at=timezone.now(),
    )  # fmt: skip
    pool = GpuPool.objects.create(
        project=project, request=request, cluster=cluster, name="held", workload_type="inference", state="active"
    )
    Allocation.objects.create(
        pool=pool, project=project, kind="mig", gpu=instance.gpu, mig_instance=instance,
        resource_name=instance.profile.resource_name, product=instance.gpu.catalog_product,
        profile_name=instance.profile.name, compute_slices=instance.profile.compute_slices,
    )  # fmt: skip
    return pool


def _dashboard_in_use(pool) -> int:
    """The pool's units that the operator dashboard shows In Use (a running workload bound to the unit)."""
    from capacity.choices import Availability

    units = MigInstance.objects.annotate_availability().filter(allocations__pool=pool)
    return units.filter(availability=Availability.IN_USE).count()


def test_a_workload_found_before_its_project_existed_is_attributed_on_the_next_discovery(sim):
    discover(sim)
    tracker = WorkloadProfile.objects.get(pod_name="tracker")
    assert tracker.project is None
    vision = Project.objects.create(name="Vision", slug="vision", namespace="team-vision")
    pool = _hold(vision, tracker.mig_instance)
    # "In use" follows the device the pod runs on (#15), so the card agrees with the dashboard at once.
    assert (pool.card()["profiles_in_use"], _dashboard_in_use(pool)) == (1, 1)

    outcome = discover(sim)

    tracker.refresh_from_db()
    assert tracker.project == vision
    assert outcome.sync.workloads.updated == WorkloadProfile.objects.running().filter(namespace="team-vision").count()
    pool = type(pool).objects.get(pk=pool.pk)
    assert (pool.card()["profiles_in_use"], pool.card()["gpus_touched_in_use"]) == (1, 1)
    assert pool.card()["profiles_in_use"] == _dashboard_in_use(pool)


def test_a_namespace_moved_to_another_project_moves_its_running_workloads(sim, vision):
    discover(sim)
    assert WorkloadProfile.objects.get(pod_name="tracker").project == vision
    Project.objects.filter(pk=vision.pk).update(namespace="team-vision-old")
    vision2 = Project.objects.create(name="Vision 2", slug="vision2", namespace="team-vision")
    discover(sim)
    assert WorkloadProfile.objects.get(pod_name="tracker").project == vision2
    again = discover(sim)
    assert again.sync.workloads.updated == 0

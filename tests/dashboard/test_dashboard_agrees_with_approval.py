"""The dashboard shows a unit Available exactly when approval would give it out, and take-offline agrees.

Where they used to disagree (a unit on an unhealthy GPU, on a cordoned or not-ready node, on a node
in the middle of a MIG change, or with a running workload), each case is set up on the two free units
of the world that approval can see (alpha a1 GPU 1's 2g.20gb, beta b2's whole GPU) and both reads
are compared.
"""

import pytest
from dashboard_world import H100, _gpu, _instance, _node

from capacity.choices import Availability
from capacity.models import GpuCapacity, MigInstance, NodeCapacity, WorkloadProfile
from operations.maintenance import take_offline_check
from pools import units
from pools.models import PoolRequest

pytestmark = pytest.mark.django_db

MIG_2G = "MIG-GPU-a1-1-0"  # a1 GPU 1, 2g.20gb at 0: free in the world
WHOLE = "GPU-b2-0"  # b2 GPU 0, whole H100: free in the world


def _drafts(project) -> dict[str, PoolRequest]:
    common = {"project": project, "product": "H100-80GB", "count": 1}
    return {
        MIG_2G: PoolRequest(spec_kind="mig", isolation="mig", profile_name="2g.20gb", **common),
        WHOLE: PoolRequest(spec_kind="full", isolation="full", **common),
    }


def _approval_would_take(project) -> set[str]:
    drafts = _drafts(project)
    taken = set(units.mig_candidates(drafts[MIG_2G]).values_list("uuid", flat=True))
    taken |= set(units.full_candidates(drafts[WHOLE]).values_list("uuid", flat=True))
    assert sum(units.free_by_cluster(drafts[MIG_2G]).values()) + sum(
        units.free_by_cluster(drafts[WHOLE]).values()
    ) == len(taken)
    return taken


def _dashboard(client, world) -> tuple[dict[str, str], dict[str, dict]]:
    """({unit uuid: status} from the node views, {cluster name: unit counts} from the overview)."""
    statuses = {}
    for cluster in (world.alpha, world.beta):
        for node in client.get(f"/admin/dashboard/clusters/{cluster.pk}/data.json").json()["nodes"]:
            for gpu in node["gpus"]:
                for instance in gpu["instances"]:
                    statuses[instance["uuid"]] = instance["status"]
                if gpu["unit"]:
                    statuses[gpu["uuid"]] = gpu["unit"]["status"]
    cards = {c["name"]: c["units"] for c in client.get("/admin/dashboard/data.json").json()["clusters"]}
    return statuses, cards


def _unhealthy(world):
    GpuCapacity.objects.filter(uuid__in=["GPU-a1-1", WHOLE]).update(health="unhealthy")


def _cordoned(world):
    NodeCapacity.objects.filter(name__in=["a1", "b2"]).update(cordoned=True)


def _not_ready(world):
    NodeCapacity.objects.filter(name__in=["a1", "b2"]).update(ready=False)


def _mid_mig_change(world):
    NodeCapacity.objects.filter(name="a1").update(mig_config_state="pending")
    GpuCapacity.objects.filter(uuid=WHOLE).update(mig_mode_pending=True)  # MIG being switched on


def _running_workload(world):
    instance = MigInstance.objects.get(uuid=MIG_2G)
    for gpu, unit, pod in ((instance.gpu, instance, "probe-0"), (GpuCapacity.objects.get(uuid=WHOLE), None, "probe-1")):
        WorkloadProfile.objects.create(
            cluster=gpu.node.cluster,
            namespace="default",
            pod_name=pod,
            pod_uid=f"uid-{pod}",
            node=gpu.node,
            gpu=gpu,
            mig_instance=unit,
            resource_name="nvidia.com/gpu",
        )


def _multi_device_pod(world):
    """A pod given two whole GPUs: only its first is in the foreign key, the second only in device_ids."""
    first = world.gpus["a2-0"]
    WorkloadProfile.objects.create(
        cluster=world.alpha,
        namespace="default",
        pod_name="train-2",
        pod_uid="uid-train-2",
        node=first.node,
        gpu=first,
        device_ids=[first.uuid, WHOLE, MIG_2G],
        count=3,
        resource_name="nvidia.com/gpu",
    )


CASES = {
    "unhealthy GPU": (_unhealthy, "unavailable", "withheld"),
    "cordoned node": (_cordoned, "unavailable", "cordoned"),
    "node not ready": (_not_ready, "unavailable", "cordoned"),
    "mid MIG change": (_mid_mig_change, "unavailable", "reconfiguring"),
    "running workload": (_running_workload, "in_use", "in_use"),
    "multi-device pod": (_multi_device_pod, "in_use", "in_use"),
}


def test_in_the_world_the_dashboard_shows_available_what_approval_would_take(client, operator, world, project):
    client.force_login(operator)
    statuses, cards = _dashboard(client, world)
    assert _approval_would_take(project) == {MIG_2G, WHOLE}
    assert {uuid for uuid, status in statuses.items() if status == "available"} >= {MIG_2G, WHOLE}
    assert (cards["alpha"]["available"], cards["alpha"]["unavailable"]) == (1, 0)


@pytest.mark.parametrize("case", CASES)
def test_a_unit_approval_would_not_take_is_not_shown_available(client, operator, world, project, case):
    setup, status, availability = CASES[case]
    setup(world)
    client.force_login(operator)
    statuses, cards = _dashboard(client, world)
    assert _approval_would_take(project) == set()
    assert (statuses[MIG_2G], statuses[WHOLE]) == (status, status)
    assert (cards["alpha"]["available"], cards["beta"]["available"]) == (0, 2)  # beta keeps its two A30 2g
    mig = MigInstance.objects.annotate_availability().get(uuid=MIG_2G)
    whole = GpuCapacity.objects.annotate_availability().get(uuid=WHOLE)
    assert (mig.availability, whole.availability) == (availability, availability)


def test_the_tile_says_why_a_unit_is_unavailable(client, operator, world):
    _cordoned(world)
    client.force_login(operator)
    nodes = client.get(f"/admin/dashboard/clusters/{world.beta.pk}/data.json").json()["nodes"]
    unit = next(n for n in nodes if n["name"] == "b2")["gpus"][0]["unit"]
    assert (unit["status"], unit["availability"], unit["availability_label"]) == (
        "unavailable",
        "cordoned",
        "Cordoned or not ready",
    )


def test_held_or_busy_wins_over_why_the_node_is_withheld(world):
    NodeCapacity.objects.filter(name="a1").update(cordoned=True)
    rows = dict(
        MigInstance.objects.annotate_availability().filter(gpu__node__name="a1").values_list("uuid", "availability")
    )
    assert rows == {
        "MIG-GPU-a1-0-0": Availability.IN_USE,  # held and running
        "MIG-GPU-a1-0-4": Availability.RESERVED,
        "MIG-GPU-a1-1-0": Availability.CORDONED,
        "MIG-GPU-a1-1-4": Availability.IN_USE,
    }


# --- Take-offline counts the same free units ------------------------------------------------------


def _busy(spare: MigInstance):
    gpu = spare.gpu
    WorkloadProfile.objects.create(
        cluster=gpu.node.cluster,
        namespace="default",
        pod_name="spare-0",
        pod_uid="uid-spare-0",
        node=gpu.node,
        gpu=gpu,
        mig_instance=spare,
        resource_name=spare.profile.resource_name,
    )


SPARE_CASES = {
    "free": lambda spare: None,
    "unhealthy GPU": lambda spare: GpuCapacity.objects.filter(pk=spare.gpu_id).update(health="unhealthy"),
    "cordoned node": lambda spare: NodeCapacity.objects.filter(pk=spare.gpu.node_id).update(cordoned=True),
    "node not ready": lambda spare: NodeCapacity.objects.filter(pk=spare.gpu.node_id).update(ready=False),
    "mid MIG change": lambda spare: NodeCapacity.objects.filter(pk=spare.gpu.node_id).update(
        mig_config_state="rebooting"
    ),
    "running workload": _busy,
}


@pytest.mark.parametrize("case", SPARE_CASES)
def test_take_offline_moves_allocations_only_onto_units_approval_would_take(world, case):
    """a1 GPU 0 (two held 3g.40gb) goes down; one spare 3g.40gb on a4 is the only way out."""
    a4 = _node(world.alpha, "a4", H100, 1, mig_strategy="mixed")
    spare = _instance(_gpu(a4, 0, H100, "H100-80GB", True), "3g.40gb", 0)
    SPARE_CASES[case](spare)
    check = take_offline_check(gpus=[world.gpus["a1-0"]])
    approval_would_take = MigInstance.objects.free().filter(pk=spare.pk).exists()
    assert check.free_elsewhere.get("H100-80GB 3g.40gb", 0) == int(approval_would_take) == int(case == "free")
    assert [h.movable for h in check.hit] == [case == "free", False]

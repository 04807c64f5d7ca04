"""Unit status semantics: In Use follows every device a workload was given, not only its first."""

import pytest
from dashboard_world import H100, _gpu, _node

from capacity.choices import Availability
from capacity.models import WorkloadProfile
from gpuaas.dashboard.status import shape_of, status_of

pytestmark = pytest.mark.django_db


def test_status_and_shape_rules():
    assert [status_of(a) for a in Availability] == [
        "in_use",
        "ready",
        "unavailable",  # ending: its reservation ended and its pods are being evicted (pools/ending.py)
        "unavailable",
        "unavailable",
        "unavailable",
        "tier_policy",  # withheld by the tier profile policy: its own state, not Unavailable
        "available",
    ]
    assert [shape_of(1), shape_of(7), shape_of(None)] == ["1g", "7g", "full"]


def test_a_two_gpu_pod_puts_both_gpus_in_use(client, operator, world, project):
    node = _node(world.beta, "b3", H100, 2)
    first, second = _gpu(node, 0, H100, "H100-80GB", False), _gpu(node, 1, H100, "H100-80GB", False)
    WorkloadProfile.objects.create(
        cluster=world.beta,
        namespace="team-a",
        pod_name="train-0",
        pod_uid="uid-train-0",
        node=node,
        gpu=first,
        device_ids=[first.uuid, second.uuid],
        count=2,
        resource_name="nvidia.com/gpu",
        project=project,
    )
    client.force_login(operator)
    beta = client.get("/admin/dashboard/data.json").json()["clusters"][1]
    assert beta["units"] == {"in_use": 2, "ready": 0, "available": 3, "tier_policy": 0, "unavailable": 0, "total": 5}
    nodes = client.get(f"/admin/dashboard/clusters/{world.beta.pk}/data.json").json()["nodes"]
    b3 = next(n for n in nodes if n["name"] == "b3")
    assert [(g["unit"]["status"], g["unit"]["workload"]) for g in b3["gpus"]] == [
        ("in_use", "team-a/train-0"),
        ("in_use", "team-a/train-0"),
    ]

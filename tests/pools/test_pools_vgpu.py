"""The vGPU tier: vm-vgpu nodes' vGPU types inventoried by discovery, offered to VM workloads with honest
isolation and overhead, priced with the vGPU licence; approved as vGPU units, provisioned as the type's quota,
metered at the vGPU price onto a statement line of its own."""

from decimal import Decimal
from fractions import Fraction

import pytest
from pool_world import kube_for

from capacity.adapters.kubernetes import Node
from capacity.mig.catalog import PRODUCTS
from capacity.models import SpecAndCount
from capacity.services.node_labels import node_specs, node_values
from capacity.vgpu import VGPU_TYPES, vgpu_type_for_resource
from pools.units.candidates import full_candidate, mig_candidates, timeslice_candidate, vgpu_candidate
from pools.units.matching import Need, match
from pricing import rates
from pricing.lookup import vgpu_price
from pricing.services import seed_default_card

URL = "/api/v1/pool-requests/"


def vgpu_node(name="kv-1", **resources) -> Node:
    capacity = {f"nvidia.com/NVIDIA_{t}": str(n) for t, n in resources.items()}
    labels = {"nvidia.com/gpu.workload.config": "vm-vgpu", "nvidia.com/vgpu.config": "H100XM-20C"}
    return Node(name, "uid", "1", labels, {}, capacity, dict(capacity), False, True)


def test_vgpu_types_have_the_real_names_and_counts():
    assert (VGPU_TYPES["H100XM-20C"].framebuffer_gb, VGPU_TYPES["H100XM-20C"].max_per_gpu) == (20, 4)
    assert (VGPU_TYPES["A100-40C"].framebuffer_gb, VGPU_TYPES["A100-40C"].max_per_gpu) == (40, 1)
    assert (VGPU_TYPES["A100-5C"].product, VGPU_TYPES["A100-5C"].max_per_gpu) == ("A100-40GB", 8)
    assert VGPU_TYPES["H100-80C"].resource_name == "nvidia.com/NVIDIA_H100-80C"
    assert vgpu_type_for_resource("nvidia.com/NVIDIA_H100XM-10C").max_per_gpu == 8
    assert vgpu_type_for_resource("nvidia.com/gpu") is None


def test_h100_16c_and_the_h200_types_are_the_device_managers():
    """NVIDIA/vgpu-device-manager examples/config-example.yaml: H100XM-16C: 5, H200X-141C: 1 ... H200X-4C: 32."""
    assert VGPU_TYPES["H100XM-16C"].max_per_gpu == 5
    h200 = {t.name: (t.framebuffer_gb, t.max_per_gpu) for t in VGPU_TYPES.values() if t.product == "H200-141GB"}
    assert h200 == {
        "H200X-141C": (141, 1),
        "H200X-70C": (70, 2),
        "H200X-35C": (35, 4),
        "H200X-28C": (28, 5),
        "H200X-17C": (17, 8),
        "H200X-14C": (14, 10),
        "H200X-8C": (8, 16),
        "H200X-7C": (7, 20),
        "H200X-4C": (4, 32),
    }
    assert VGPU_TYPES["H200-35C"].product == "H200-141GB-NVL"
    assert vgpu_type_for_resource("nvidia.com/NVIDIA_H200X-35C").max_per_gpu == 4


def test_discovery_inventories_vgpu_types_per_node():
    node = vgpu_node(**{"H100XM-20C": 32})
    specs = node_specs(node, node_values(node))
    assert [(s.resource_name, s.kind, s.product, s.profile_name, s.count, s.replicas) for s in specs] == [
        ("nvidia.com/NVIDIA_H100XM-20C", "vgpu", "H100-80GB", "H100XM-20C", 32, 4)
    ]


FLEET = [
    *mig_candidates(PRODUCTS["H100-80GB"]),
    full_candidate("H100-80GB", Fraction(80), 8),
    timeslice_candidate("H100-80GB", Fraction(80), 4),
    vgpu_candidate(VGPU_TYPES["H100XM-20C"]),
    vgpu_candidate(VGPU_TYPES["H100XM-40C"]),
]


def price(kind, product, profile_name, replicas):
    if kind == "vgpu":
        return vgpu_price(Decimal("2.50"), replicas)
    return rates.derive_price(Decimal("2.50"), rates.spec_key(kind, product, profile_name, replicas))


def test_a_vm_gets_the_smallest_vgpu_that_fits_and_says_what_it_costs(settings):
    settings.BILLING_VGPU_LICENCE_HOURLY = Decimal("0.10")
    result = match(Need("staging", memory_gib=16, vm=True), FLEET, price=price)
    chosen = result.chosen
    assert (chosen.label, chosen.tier, chosen.unit_price) == ("vGPU H100XM-20C (H100-80GB)", "2", Decimal("0.725000"))
    assert "dedicated 20 GB framebuffer, compute time-sliced 1/4" in chosen.note
    assert "5-15% slower than bare metal" in chosen.note
    explained = {o.label: o.explanation() for o in result.rejected}
    assert "a virtual machine gets its GPU as a vGPU" in explained["MIG 3g.40gb (H100-80GB)"]


def test_containers_are_not_offered_vgpus_and_compute_isolation_is_honest():
    result = match(Need("inference", memory_gib=16), FLEET, price=price)
    explained = {o.label: o.explanation() for o in result.rejected}
    assert (
        "time-sliced compute: no compute isolation, you asked for isolation=hardware"
        in explained["vGPU H100XM-20C (H100-80GB)"]
    )
    assert "declare vm=true for a VM workload" in explained["vGPU H100XM-20C (H100-80GB)"]
    too_big = match(Need("staging", memory_gib=60, vm=True), FLEET, price=price)
    assert too_big.chosen is None
    assert (
        "has a 40 GB framebuffer, you asked for 60 GiB"
        in {o.label: o.explanation() for o in too_big.rejected}["vGPU H100XM-40C (H100-80GB)"]
    )


@pytest.mark.django_db
def test_dry_run_offers_the_fleets_vgpus_with_licence_and_forecast(api, bob, fleet, settings):
    settings.BILLING_VGPU_LICENCE_HOURLY = Decimal("0.05")
    node = fleet.full_node("kv-1", gpus=8, tier="2")
    SpecAndCount.objects.create(
        node=node,
        kind="vgpu",
        product="H100-80GB",
        profile_name="H100XM-20C",
        resource_name="nvidia.com/NVIDIA_H100XM-20C",
        count=32,
        allocatable=32,
        replicas=4,
    )
    seed_default_card()
    response = api(bob).post(
        f"{URL}dry-run/", {"workload_type": "staging", "memory_gib": 16, "vm": True, "count": 2}, format="json"
    )
    assert response.status_code == 200, response.data
    chosen = response.data["chosen"]
    assert (chosen["kind"], chosen["profile_name"], chosen["unit_hourly_price"], chosen["forecast"]) == (
        "vgpu",
        "H100XM-20C",
        "0.675000",
        "free now",
    )
    assert chosen["isolation"] == "memory"


# --- A VM names its vGPU type ---------------------------------------------------------------------------------


@pytest.fixture
def vgpu_fleet(fleet):
    """One vm-vgpu node of 8 H100 SXM GPUs as discovery records it, offering H100XM-20C and H100XM-40C."""
    node = fleet.full_node("kv-1", gpus=8, tier="2")
    for name, per_gpu in (("H100XM-20C", 4), ("H100XM-40C", 2)):
        SpecAndCount.objects.create(
            node=node,
            kind="vgpu",
            product="H100-80GB",
            profile_name=name,
            resource_name=f"nvidia.com/NVIDIA_{name}",
            count=8 * per_gpu,
            allocatable=8 * per_gpu,
            replicas=per_gpu,
        )
    seed_default_card()
    return node


@pytest.mark.django_db
def test_a_vm_request_naming_a_vgpu_type_gets_that_type(api, bob, project, vgpu_fleet):
    from pools.models import PoolRequest

    body = {"project": project.pk, "workload_type": "staging", "memory_gib": 16, "vgpu_type": "H100XM-40C"}
    response = api(bob).post(URL, body, format="json")
    assert response.status_code == 201, response.data
    request = PoolRequest.objects.get(pk=response.data["id"])
    assert (request.spec_kind, request.profile_name) == ("vgpu", "H100XM-40C")  # not the cheaper 20C that fits
    assert "vgpu_type" not in response.data  # a declaration: the stored profile_name is the type


@pytest.mark.django_db
def test_a_vgpu_type_the_fleet_does_not_offer_is_a_400_naming_the_ones_it_does(api, bob, project, vgpu_fleet):
    from pools.models import PoolRequest

    body = {"project": project.pk, "workload_type": "staging", "vgpu_type": "H100XM-10C"}
    response = api(bob).post(URL, body, format="json")
    assert response.status_code == 400
    assert response.data == {
        "vgpu_type": ["Unknown vGPU type 'H100XM-10C': the vm-vgpu nodes offer H100XM-20C, H100XM-40C."]
    }
    dry = api(bob).post(f"{URL}dry-run/", {"workload_type": "staging", "vgpu_type": "A100-40C"}, format="json")
    assert dry.status_code == 400 and list(dry.data) == ["vgpu_type"]
    assert not PoolRequest.objects.exists()


@pytest.mark.django_db
def test_a_named_vgpu_type_must_still_meet_the_declared_needs(api, bob, project, vgpu_fleet):
    body = {"project": project.pk, "workload_type": "staging", "memory_gib": 30, "vgpu_type": "H100XM-20C"}
    response = api(bob).post(URL, body, format="json")
    assert response.status_code == 400
    assert response.data["memory_gib"] == ["vGPU H100XM-20C (H100-80GB): has a 20 GB framebuffer, you asked for 30 GiB"]
    pinned = {"project": project.pk, "vgpu_type": "H100XM-20C", "profile_name": "3g.40gb"}
    assert list(api(bob).post(URL, pinned, format="json").data) == ["vgpu_type"]


@pytest.mark.django_db
def test_dry_run_with_a_vgpu_type_offers_only_that_type(api, bob, vgpu_fleet):
    response = api(bob).post(f"{URL}dry-run/", {"workload_type": "staging", "vgpu_type": "H100XM-40C"}, format="json")
    assert response.status_code == 200, response.data
    assert [(o["kind"], o["profile_name"]) for o in response.data["offers"]] == [("vgpu", "H100XM-40C")]
    assert response.data["rejected"] == []


# --- End to end: inventory -> request (vm=true) -> approval -> provisioning -> statement line ---------------


def _make_vgpu_node(sim, name="prod-h100-full-02", vgpu_type="H100XM-20C"):
    """Turn one of the demo's full-GPU nodes into a vm-vgpu node of tier 2, and discover it again."""
    from capacity.services.discovery import discover_cluster
    from simcluster.gpuoperator import refresh_devices

    cluster = sim.state.cluster("prod")
    with sim.state.lock:
        node = cluster.nodes[name]
        node.labels.update(
            {"nvidia.com/gpu.workload.config": "vm-vgpu", "nvidia.com/vgpu.config": vgpu_type, "gpuaas.io/tier": "2"}
        )
        refresh_devices(cluster, node)
    assert discover_cluster(sim.clusters["prod"].pk, inventory="inline").run.status == "succeeded"


def test_a_vm_request_is_approved_provisioned_and_billed_as_vgpus(
    sim, api, bob, operator, project, settings, django_capture_on_commit_callbacks
):
    import datetime as dt

    from django.utils import timezone

    from billing import services as billing
    from billing.models import StatementLine
    from pools import services
    from pools.models import Allocation, PoolRequest
    from pools.tasks import provision_pool_task

    settings.BILLING_VGPU_LICENCE_HOURLY = Decimal("0.05")
    seed_default_card()
    _make_vgpu_node(sim)
    assert SpecAndCount.objects.get(node__name="prod-h100-full-02", kind="vgpu").count == 32  # 8 GPUs x 4

    body = {"project": project.pk, "workload_type": "staging", "memory_gib": 16, "vm": True, "count": 6}
    response = api(bob).post(URL, body, format="json")
    assert response.status_code == 201, response.data
    request = PoolRequest.objects.get(pk=response.data["id"])
    assert (request.spec_kind, request.isolation, request.tier, request.profile_name) == (
        "vgpu",
        "vgpu",
        "2",
        "H100XM-20C",
    )
    request.state = "submitted"
    request.save(update_fields=["state"])

    pool = services.approve(request, actor=operator)
    units = list(
        Allocation.objects.filter(pool=pool).values_list("gpu__node__name", "kind", "resource_name", "replica")
    )
    assert {(n, k, r) for n, k, r, _ in units} == {("prod-h100-full-02", "vgpu", "nvidia.com/NVIDIA_H100XM-20C")}
    assert len(units) == 6
    assert len(set(Allocation.objects.filter(pool=pool).values_list("gpu_id", flat=True))) == 2  # packed: 4 + 2

    assert provision_pool_task(pool.pk) == "active"
    with kube_for(sim.clusters["prod"]) as kube:
        hard = kube.get_resource_quota("team-a", f"gpuaas-{pool.pk}")["spec"]["hard"]
        placement = kube.get_config_map("team-a", f"gpuaas-pool-{pool.pk}")
    assert hard["requests.nvidia.com/NVIDIA_H100XM-20C"] == "6"
    assert hard["requests.nvidia.com/gpu"] == "0"
    assert "gpuaas.io/tier" in placement["data"]["affinity.json"]

    start = timezone.now().replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=2)
    Allocation.objects.filter(pool=pool).update(allocated_at=start)
    billing.meter_usage(now=start + dt.timedelta(hours=2))
    statement = billing.generate_statement(project, start.date().replace(day=1))
    (line,) = StatementLine.objects.filter(statement=statement, kind="vgpu")
    assert (line.profile_name, line.replicas, line.hourly_rate) == ("H100XM-20C", 4, Decimal("0.675000"))
    assert "vGPU H100XM-20C (1/4 GPU + licence 0.05/h, 5-15% slower than bare metal) @ 0.675/h" in line.description
    assert line.amount == Decimal("0.675000") * 6 * 2

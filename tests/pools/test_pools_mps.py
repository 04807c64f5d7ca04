"""MPS chosen by operators (issue #30): an MPS sharing policy reaches the device plugin as NVIDIA documents it,
the simulator's device plugin advertises its clients, and an MPS pool goes request -> approval -> pod running ->
metered -> billed at the MPS price, its own unit kind; the operator's client limits reach the pool's pods.

Against the demo scenario's "dev" cluster (two nodes of 8 H200 GPUs, time-sliced x4, tier 3)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
import yaml
from django.utils import timezone
from pool_world import kube_for

from billing import services as billing
from billing.models import StatementLine
from capacity.models import NodeCapacity, TimeSlicingPolicy, WorkloadProfile
from capacity.services.discovery import discover_cluster
from capacity.services.mig_configs import apply_time_slicing
from pools import services
from pools.models import Allocation, PoolRequest
from pools.tasks import provision_pool_task
from pricing.models import RateCardEntry
from pricing.services import seed_default_card
from simcluster.kube import ClusterApi

pytestmark = pytest.mark.django_db
URL = "/api/v1/pool-requests/"


def _mps_dev_cluster(sim, **limits) -> TimeSlicingPolicy:
    """The dev cluster's nodes switched from time-slicing x4 to MPS x4 by an operator's policy, and discovered."""
    cluster = sim.clusters["dev"]
    policy = TimeSlicingPolicy.objects.create(cluster=cluster, strategy="mps", replicas=4, **limits)
    apply_time_slicing(cluster)
    assert discover_cluster(cluster.pk, inventory="inline").run.status == "succeeded"
    return policy


def _create_pod(sim, namespace: str, name: str) -> dict:
    spec = {
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    }
    with sim.state.lock:
        ClusterApi(sim.state.cluster("dev")).create("pods", namespace, {"metadata": {"name": name}, "spec": spec})
    return sim.state.cluster("dev").pods[(namespace, name)].obj


def test_the_mps_policy_is_written_as_nvidia_documents_it_and_the_device_plugin_advertises_its_clients(sim):
    policy = _mps_dev_cluster(sim, pinned_memory_limit_mib=20000, active_thread_percentage=20)
    with kube_for(sim.clusters["dev"]) as kube:
        data = kube.get_config_map("gpu-operator", "time-slicing-config")["data"]
    # Only renameByDefault and resources[].replicas: the limits are no plugin setting (NVIDIA/k8s-device-plugin
    # api/config/v1/replicas.go); its MPS daemon derives its own from the replicas.
    assert yaml.safe_load(data[policy.config_key]) == {
        "version": "v1",
        "sharing": {"mps": {"renameByDefault": False, "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}},
    }
    node = sim.state.cluster("dev").nodes["dev-h200-ts-01"]
    assert node.labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert node.device_capacity["nvidia.com/gpu"] == 32  # 8 GPUs x 4 clients
    assert node.sharing.fail_requests_greater_than_one  # MPS refuses more than one replica when unset
    row = NodeCapacity.objects.get(name="dev-h200-ts-01")
    assert (row.sharing_strategy, row.timeslice_replicas) == ("mps", 4)
    # The tighter of the daemon's (memory / 4, 25 %) and the operator's limits.
    assert policy.client_limits(143771) == {"pinned_memory_mib": 20000, "active_thread_percentage": 20}
    assert policy.client_limits(40000) == {"pinned_memory_mib": 10000, "active_thread_percentage": 20}


def test_an_mps_pool_is_requested_approved_run_metered_and_billed_as_mps_shares(
    sim, api, bob, operator, project, settings
):
    card, _ = seed_default_card()
    _mps_dev_cluster(sim, pinned_memory_limit_mib=30000, active_thread_percentage=20)
    full = RateCardEntry.objects.get(card=card, kind="full", product="H200-141GB").hourly_price
    # An operator prices MPS shares apart from time-slices: a quarter-GPU MPS client at 0.40 of the full price.
    RateCardEntry.objects.create(
        card=card,
        kind="mps",
        product="H200-141GB",
        replicas=4,
        hourly_price=(full * Decimal("0.4")).quantize(Decimal("0.000001")),
        is_override=True,
        rule="operator",
    )
    mps_price = full * Decimal("0.4")

    body = {"project": project.pk, "isolation": "mps", "product": "H200-141GB", "count": 2}
    response = api(bob).post(URL, body, format="json")
    assert response.status_code == 201, response.data
    request = PoolRequest.objects.get(pk=response.data["id"])
    assert (request.spec_kind, request.isolation, request.tier) == ("mps", "mps", "3")
    assert request.spec_label == "H200-141GB MPS replica"
    services.submit(request, actor=bob)

    pool = services.approve(request, actor=operator)
    units = list(Allocation.objects.filter(pool=pool).values_list("kind", "resource_name", "gpu__node__cluster"))
    assert units == [("mps", "nvidia.com/gpu", sim.clusters["dev"].pk)] * 2
    assert provision_pool_task(pool.pk) == "active"
    with kube_for(sim.clusters["dev"]) as kube:
        hard = kube.get_resource_quota("team-a", f"gpuaas-{pool.pk}")["spec"]["hard"]
        placement = kube.get_config_map("team-a", f"gpuaas-pool-{pool.pk}")["data"]
    assert hard["requests.nvidia.com/gpu"] == "2"
    # The operator's limits reach the pods through the pool's ConfigMap (envFrom), with its PriorityClass.
    assert placement["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=30000M"
    assert placement["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
    assert placement["priorityClassName"] == "gpuaas-shared-normal"
    assert sim.state.cluster("dev").priorityclasses["gpuaas-shared-normal"].obj["value"] == 1000

    assert _create_pod(sim, "team-a", "mps-client")["status"]["phase"] == "Running"
    assert discover_cluster(sim.clusters["dev"].pk, inventory="inline").run.status == "succeeded"
    # The workload mirror sees the client on the pool's node (the device plugin binds by count: which of the
    # node's MPS replicas the kubelet hands out is its choice, docs/pools.md).
    (client,) = WorkloadProfile.objects.running().filter(namespace="team-a")
    assert (client.pod_name, client.node.name, client.resource_name) == (
        "mps-client",
        "dev-h200-ts-01",
        "nvidia.com/gpu",
    )
    assert set(Allocation.objects.filter(pool=pool).values_list("gpu__node__name", flat=True)) == {"dev-h200-ts-01"}

    start = timezone.now().replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=2)
    Allocation.objects.filter(pool=pool).update(allocated_at=start)
    billing.meter_usage(now=start + dt.timedelta(hours=2))
    statement = billing.generate_statement(project, start.date().replace(day=1))
    (line,) = StatementLine.objects.filter(statement=statement, kind="mps")
    assert (line.product, line.replicas, line.hourly_rate) == ("H200-141GB", 4, mps_price)
    assert "H200-141GB 1/4 MPS share" in line.description
    assert line.amount == mps_price * 2 * 2
    assert not StatementLine.objects.filter(statement=statement, kind="timeslice").exists()


def test_an_mps_share_is_priced_from_the_full_gpu_unless_the_card_says_otherwise():
    from pricing import rates

    key = rates.spec_key("mps", "H100-80GB", "ignored", 4)
    assert (key.profile_name, key.replicas, key.label()) == ("", 4, "H100-80GB 1/4 MPS share")
    assert rates.derive_price(Decimal("3.00"), key) == Decimal("0.750000")
    assert rates.derivation_rule(key) == "full / 4"


def test_a_time_slice_request_does_not_take_mps_replicas(sim, make_request, operator):
    from pools.exceptions import InsufficientCapacity

    _mps_dev_cluster(sim)
    request = make_request(isolation="timeslice", product="H200-141GB", profile_name="", count=1)
    with pytest.raises(InsufficientCapacity):
        services.approve(request, actor=operator)
    assert not Allocation.objects.exists()

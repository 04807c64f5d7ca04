"""Discovery of the demo scenario finds exactly what the simulator says it built (expected_counts())."""

from collections import Counter

import pytest
from django.db.models import Count, Sum

from capacity.models import DiscoveryRun, GpuCapacity, MigInstance, NodeCapacity, SpecAndCount, WorkloadProfile
from capacity.services.discovery import discover_cluster

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("retry_waits")]


@pytest.fixture
def demo(simcluster):
    sim = simcluster("demo")
    for cluster in sim.register().values():
        outcome = discover_cluster(cluster.pk, inventory="inline")
        assert outcome.run.status == "succeeded", outcome.run.error
        assert outcome.inventory.errors == {}
    return sim


@pytest.mark.parametrize("name", ["prod", "dev"])
def test_counts_per_product_profile_and_tier_match_the_scenario(demo, name):
    cluster = demo.clusters[name]
    expected = demo.expected(name)
    nodes = NodeCapacity.objects.for_cluster(cluster).present()
    gpus = GpuCapacity.objects.for_cluster(cluster).present()

    def by(queryset, field):
        return dict(queryset.values_list(field).annotate(n=Count("id")).order_by())

    assert nodes.count() == expected["nodes"]
    assert by(gpus, "catalog_product") == expected["gpus"]
    assert by(gpus.filter(mig_mode_current=True), "catalog_product") == expected["mig_enabled_gpus"]
    assert by(gpus.filter(mig_mode_current=False), "catalog_product") == expected["full_gpus"]
    instances = Counter(
        MigInstance.objects.active().filter(gpu__node__cluster=cluster).values_list("profile__product", "profile__name")
    )
    nested: dict = {}
    for (product, profile), n in instances.items():
        nested.setdefault(product, {})[profile] = n
    assert nested == expected["mig_instances"]
    assert by(nodes, "tier") == expected["tiers"]
    allocatable = dict(
        SpecAndCount.objects.filter(node__cluster=cluster)
        .values_list("resource_name")
        .annotate(n=Sum("allocatable"))
        .order_by()
    )
    assert allocatable == expected["allocatable"]
    # The Kubernetes-only view (labels) agrees with NVML on the number of physical GPUs.
    assert sum(nodes.values_list("gpu_count", flat=True)) == sum(expected["gpus"].values())
    assert WorkloadProfile.objects.filter(cluster=cluster).running().count() == expected["pods"]


def test_prod_totals_read_like_the_seed(demo):
    totals = {
        (t["product"], t["kind"], t["profile_name"]): t["count"]
        for t in SpecAndCount.objects.filter(node__cluster=demo.clusters["prod"]).totals()
    }
    assert totals == {
        ("H100-80GB", "full", ""): 16,
        ("H100-80GB", "mig", "1g.10gb"): 40,  # 32 on tier 1, 8 on tier 2's GPUs 6-7
        ("H100-80GB", "mig", "2g.20gb"): 20,
        ("H100-80GB", "mig", "3g.40gb"): 32,
        ("H100-80GB", "mig", "4g.40gb"): 12,
    }
    dev = list(SpecAndCount.objects.filter(node__cluster=demo.clusters["dev"]))
    assert {(s.label, s.count, s.replicas) for s in dev} == {("H200-141GB 1/4 time-slice", 32, 4)}


def test_nodes_carry_group_strategy_config_and_state(demo):
    node = NodeCapacity.objects.get(name="prod-h100-4g3g-01")
    assert (node.gpu_product, node.gpu_count, node.tier, node.mig_strategy) == (
        "NVIDIA-H100-80GB-HBM3",
        8,
        "2",
        "mixed",
    )
    assert (node.mig_config, node.mig_config_state, node.ready, node.cordoned) == ("prod-4g-3g", "success", True, False)
    assert node.labels["topology.kubernetes.io/zone"] == "zone-a"
    assert "nvidia.com/gfd.timestamp" not in node.labels
    dev = NodeCapacity.objects.get(name="dev-h200-ts-01")
    assert (dev.timeslice_replicas, dev.tier, dev.mig_strategy) == (4, "3", "none")


def test_gpu_rows_carry_nvml_identity_and_driver(demo):
    gpu = GpuCapacity.objects.get(node__name="prod-h100-full-01", index=0)
    assert gpu.uuid.startswith("GPU-")
    assert (gpu.product, gpu.catalog_product, gpu.memory_mib) == ("NVIDIA H100 80GB HBM3", "H100-80GB", 81559)
    assert (gpu.driver_version, gpu.cuda_version, gpu.pci_bus_id) == ("550.54.15", "12.4", "00000000:18:00.0")
    assert (gpu.health, gpu.lost_at, gpu.mig_mode_current) == ("ok", None, False)
    dev_gpu = GpuCapacity.objects.get(node__name="dev-h200-ts-02", index=7)
    assert (dev_gpu.driver_version, dev_gpu.catalog_product) == ("550.90.07", "H200-141GB")


def test_a_second_discovery_writes_nothing(demo):
    prod = demo.clusters["prod"]
    before = list(NodeCapacity.objects.for_cluster(prod).values_list("id", "last_seen_at", "resource_version"))
    outcome = discover_cluster(prod.pk, inventory="inline")
    sync, inventory = outcome.sync, outcome.inventory
    assert (sync.nodes_created, sync.nodes_updated, sync.nodes_gone, sync.specs_written) == (0, 0, 0, 0)
    assert (sync.workloads.created, sync.workloads.updated, sync.workloads.ended) == (0, 0, 0)
    assert (inventory.gpus_written, inventory.mig_written, inventory.gpus_lost, inventory.mig_gone) == (0, 0, 0, 0)
    assert list(NodeCapacity.objects.for_cluster(prod).values_list("id", "last_seen_at", "resource_version")) == before
    assert DiscoveryRun.objects.filter(cluster=prod, status="succeeded").count() == 2
    prod.refresh_from_db()
    assert (prod.status, prod.last_error) == ("ok", "")
    assert outcome.run.started_at <= prod.last_success_at <= outcome.run.finished_at

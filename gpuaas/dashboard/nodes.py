"""One cluster's node view (a column per node, a tile per GPU and per MIG instance) and one GPU's MIG picture.

Units are loaded for a page of nodes at a time in a fixed number of queries (nodes, GPUs, MIG
instances, allocations, workloads, plus the monitoring reads in sources.py), then assembled here.
"""

from __future__ import annotations

from collections import defaultdict

from django.core.paginator import Paginator
from django.db.models import F
from django.urls import reverse

from capacity import tiers
from capacity.choices import Availability
from capacity.models import Cluster, GpuCapacity, MigInstance, NodeCapacity, WorkloadProfile
from pools.models import Allocation

from . import sources
from .fleet import profile_distribution, tier_policies, unit_groups
from .status import FULL, SHAPE_LABELS, memory_slices_of, shape_of, status_of

NODES_PER_PAGE = 50


def _holders(gpus: list[GpuCapacity], instances: list[MigInstance], gpu_ids) -> tuple[dict, dict]:
    """Who holds each unit and what runs on it: ({unit key: allocation}, {unit key: workload}).

    A unit key is (gpu_id, mig_instance_id or None). A workload given several devices is bound to
    each of them (its device_ids); the others are matched by UUID among the GPUs and instances shown.
    """
    allocations = {}
    for row in (
        Allocation.objects.active()
        .filter(gpu_id__in=gpu_ids)
        .values("gpu_id", "mig_instance_id", "pool_id", "pool__name", "project__slug", "project__name")
        .order_by("pk")
    ):
        allocations.setdefault((row["gpu_id"], row["mig_instance_id"]), row)
    by_uuid = {g.uuid: (g.pk, None) for g in gpus} | {i.uuid: (i.gpu_id, i.pk) for i in instances}
    workloads = {}
    for row in (
        WorkloadProfile.objects.running()
        .filter(gpu_id__in=gpu_ids)
        .values("gpu_id", "mig_instance_id", "namespace", "pod_name", "device_ids")
        .order_by("started_at", "pk")
    ):
        keys = {(row["gpu_id"], row["mig_instance_id"])}
        for device in row["device_ids"] or []:
            key = by_uuid.get(device.split("::", 1)[0])
            if key is not None:
                keys.add(key)
        for key in keys:
            workloads.setdefault(key, row)
    return allocations, workloads


def _unit(
    key: tuple[int, int | None], availability: str, label: str, allocations: dict, workloads: dict, metrics: dict
) -> dict:
    allocation = allocations.get(key)
    workload = workloads.get(key)
    return {
        "status": status_of(availability),
        "availability": availability,
        "availability_label": label,
        "project": allocation["project__slug"] if allocation else None,
        "pool": allocation["pool__name"] if allocation else None,
        "pool_id": allocation["pool_id"] if allocation else None,
        "workload": f"{workload['namespace']}/{workload['pod_name']}" if workload else None,
        "metrics": metrics.get(key),
    }


def describe_gpus(
    gpus: list[GpuCapacity], scope=None, busy_devices: frozenset[str] | None = None, table: dict | None = None
) -> list[dict]:
    """GPU tiles with their units (the whole GPU, or each active MIG instance at its placement).

    `gpus` come from GpuCapacity.objects.annotate_availability(). Seven queries for any number of GPUs
    (instances, allocations, workloads, metrics, health events, the tier profile policies unless `table`
    is given, and multi-device pods unless `busy_devices` is given, as in annotate_availability()). A unit's status
    is its availability, the approval's definition; one withheld by the tier policy is labelled with its
    node's tier's rule (capacity.tiers.availability_label).
    """
    # `scope`: the same GPUs as a subquery. The node view sends the page's ids as literals instead: with a
    # subquery PostgreSQL cannot tell that a page is a few hundred GPUs, and reads every allocation.
    gpu_ids = [g.pk for g in gpus] if scope is None else scope
    if busy_devices is None:
        busy_devices = WorkloadProfile.objects.running().multi_device_uuids()
    table = tiers.policies() if table is None else table
    instances: dict[int, list[MigInstance]] = defaultdict(list)
    # The instances' ids first, as literals: the holders of those instances only are read (within, an index
    # probe each), not every active allocation of the fleet.
    ids = list(MigInstance.objects.filter(gpu_id__in=gpu_ids).values_list("pk", flat=True))
    active = list(
        MigInstance.objects.annotate_availability(busy_devices, fleet=True, table=table, within={"pk__in": ids})
        .annotate(node_tier=F("gpu__node__tier"))
        .select_related("profile")
    )
    for instance in active:
        instances[instance.gpu_id].append(instance)
    allocations, workloads = _holders(gpus, active, gpu_ids)
    metrics = sources.latest_unit_metrics(gpu_ids)
    events = sources.open_events_by_gpu(gpu_ids)
    tiles = []
    for gpu in gpus:
        tile = {
            "id": gpu.pk,
            "index": gpu.index,
            "uuid": gpu.uuid,
            "product": gpu.product,
            "catalog_product": gpu.catalog_product,
            "memory_mib": gpu.memory_mib,
            "health": gpu.health,
            "health_label": gpu.get_health_display(),
            "mig": gpu.mig_mode_current,
            "mig_pending": gpu.mig_mode_pending,
            "memory_slices": memory_slices_of(gpu.catalog_product),
            "metrics": metrics.get((gpu.pk, None)),
            "events": events.get(gpu.pk, []),
            "instances": [],
            "unit": None,
        }
        if gpu.mig_mode_current:
            for instance in instances[gpu.pk]:
                profile = instance.profile
                tile["instances"].append(
                    {
                        "id": instance.pk,
                        "uuid": instance.uuid,
                        "profile": profile.name,
                        "shape": shape_of(profile.compute_slices),
                        "shape_label": SHAPE_LABELS[shape_of(profile.compute_slices)],
                        "start": instance.placement_start,
                        "size": instance.placement_size,
                        "memory_mib": profile.memory_mib,
                        "multiprocessors": profile.multiprocessors,
                        "gi_id": instance.gi_id,
                        "ci_id": instance.ci_id,
                        **_unit(
                            (gpu.pk, instance.pk),
                            instance.availability,
                            tiers.availability_label(instance.availability, instance.node_tier, table),
                            allocations,
                            workloads,
                            metrics,
                        ),
                    }
                )
        else:
            tile["unit"] = {"shape": FULL, "shape_label": SHAPE_LABELS[FULL]} | _unit(
                (gpu.pk, None), gpu.availability, Availability(gpu.availability).label, allocations, workloads, metrics
            )
        tiles.append(tile)
    return tiles


def node_view(cluster: Cluster, page_number: int | str = 1) -> dict:
    """The node view of one cluster: summary, profile distribution and one page of nodes with their GPUs."""
    nodes = NodeCapacity.objects.present().filter(cluster=cluster).order_by("name")
    page = Paginator(nodes, NODES_PER_PAGE).get_page(page_number)
    page_nodes = list(page.object_list)
    node_ids = [node.pk for node in page_nodes]
    busy_devices = WorkloadProfile.objects.running().multi_device_uuids()
    # The page's GPU ids first, as literals: the holders of those GPUs only are read (within), not every
    # allocation of the fleet.
    page_ids = list(GpuCapacity.objects.present().filter(node_id__in=node_ids).values_list("pk", flat=True))
    on_page = GpuCapacity.objects.present().annotate_availability(busy_devices, fleet=True, within={"pk__in": page_ids})
    gpus = list(on_page.order_by("node_id", "index"))
    tiles_by_node: dict[int, list[dict]] = defaultdict(list)
    gpu_node = {gpu.pk: gpu.node_id for gpu in gpus}
    table = tiers.policies()
    for tile in describe_gpus(gpus, None, busy_devices, table):
        tiles_by_node[gpu_node[tile["id"]]].append(tile)
    groups = unit_groups([cluster.pk], busy_devices, table)
    health = sources.health_counters([cluster.pk])
    return {
        "cluster": {"id": cluster.pk, "name": cluster.name, "status": cluster.status},
        "summary": {
            "nodes": page.paginator.count,
            "gpus": GpuCapacity.objects.present().filter(node__cluster=cluster).count(),
            "mig_instances": sum(g.count for g in groups if g.shape != FULL),
            "health": health[cluster.pk],
        },
        "profiles": profile_distribution(groups),
        "tier_policies": tier_policies(table),
        "metrics_available": sources.metrics_available(),
        "gpu_url": reverse("admin:gpuaas_dashboard_gpu", args=[0]).replace("/0/", "/{id}/"),
        "page": {"number": page.number, "pages": page.paginator.num_pages, "per_page": NODES_PER_PAGE},
        "nodes": [
            {
                "id": node.pk,
                "name": node.name,
                "ready": node.ready,
                "cordoned": node.cordoned,
                "gpu_product": node.gpu_product,
                "tier": node.get_tier_display(),
                "node_group": node.node_group,
                "mig_config": node.mig_config,
                "mig_config_state": node.mig_config_state,
                "gpus": tiles_by_node[node.pk],
            }
            for node in page_nodes
        ],
    }


def gpu_picture(gpu: GpuCapacity) -> dict:
    """One GPU's MIG picture and specifications: its memory slices with instances at their placements."""
    tile = describe_gpus([gpu])[0]
    node = gpu.node
    return {
        "cluster": {
            "id": node.cluster_id,
            "name": node.cluster.name,
            "url": reverse("admin:gpuaas_dashboard_cluster", args=[node.cluster_id]),
        },
        "node": {"id": node.pk, "name": node.name, "gpu_product": node.gpu_product},
        "gpu": tile
        | {
            "driver_version": gpu.driver_version,
            "cuda_version": gpu.cuda_version,
            "serial": gpu.serial,
            "pci_bus_id": gpu.pci_bus_id,
            "last_seen_at": gpu.last_seen_at.isoformat(),
        },
        "metrics_available": sources.metrics_available(),
    }

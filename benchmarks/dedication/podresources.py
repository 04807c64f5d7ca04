"""The dedication benchmark's device-plugin fleet whose attribution comes only from the kubelet's PodResources.

An in-process simulator (SimServer, one PodResources socket per node) with H100 80GB and H200 141GB nodes of 4
GPUs, half MIG (two 3g instances per GPU: 3g.40gb on H100, 3g.71gb on H200), half whole GPUs. Projects share
every node (one unit per node stays unallocated and idle). Pods churn through the simulator's API server:
holders fill their units (whole-GPU pods ask for 2 GPUs where they hold 2, so one pod holds several devices),
a third are deleted, a second wave arrives, and some projects run pods on nodes where they hold nothing. The
pods carry no device annotation: only the node's kubelet knows what it handed out.

One poll cycle as production runs it: discovery mirrors the pods (devices unknown), the node agents of the
nodes it names read PodResources with their inventories, MONITORING_TRESPASS_POLLS metric polls of every node
(idle units read what idle H100s and H200s read: the driver's reservation, no SM activity), then the
trespass check.

- dp_device_pairs: (pod, device) pairs the simulated kubelet handed out (the truth);
- dp_attribution_errors: running pods whose mirrored devices (every WorkloadProfile row of the pod, all its
  device ids) or project differ from the truth, or that have none;
- dp_nvml_attributions: workloads the NVML process list attributed (must be 0: the kubelet answered);
- dp_false_trespass: open trespass events that match no pair on a unit not held by the pod's project,
  including activity alarms on idle units; dp_trespass_detected / dp_trespass_injected for the real ones;
- dp_in_use_errors: active allocations whose "in use" (Allocation.objects.in_use()) differs from whether a
  pod holds the unit's device (every (pod, device) pair counts, a 2-GPU pod on both).
"""

from __future__ import annotations

import random
import tempfile
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from capacity.models import Cluster, GpuCapacity, MigInstance, NodeCapacity, WorkloadProfile
from capacity.services.discovery import discover_cluster
from capacity.services.inventory import inventory_nodes
from monitoring.models import TrespassEvent
from monitoring.services.reports import poll_node
from monitoring.services.trespass import detect_trespass, unit_key
from pools.models import Allocation
from simcluster import SimServer
from simcluster.scenarios import Scenario
from tenancy.models import Project

from .dealt_units import GPU_RESOURCE, PodChurn, deal

CLUSTER = "dp-fleet"
PRODUCTS = (("H100-80GB", "3g.40gb"), ("H200-141GB", "3g.71gb"))


def _scenario(nodes: int, seed: int) -> Scenario:
    groups = []
    per_product = max(1, nodes // 2)
    for key, profile in PRODUCTS:
        short = key.split("-")[0].lower()
        mig = per_product // 2 or 1
        groups.append(
            {
                "name_prefix": f"{short}-mig",
                "count": mig,
                "product": key,
                "gpus_per_node": 4,
                "mig_strategy": "mixed",
                "mig_layout": [profile, profile],
            }
        )
        groups.append(
            {
                "name_prefix": f"{short}-full",
                "count": max(1, per_product - mig),
                "product": key,
                "gpus_per_node": 4,
                "mig_strategy": "mixed",
            }
        )
    return Scenario.from_dict({"name": CLUSTER, "seed": seed, "clusters": [{"name": CLUSTER, "node_groups": groups}]})


def _allocate(cluster: Cluster, projects: list[Project], rng: random.Random) -> dict[str, dict[int, list]]:
    """Two holders per node, units dealt in pairs, the node's last unit left unallocated.
    Returns {node: {project id: [(resource, uuid)]}}."""
    return deal(
        cluster,
        lambda: rng.sample(projects, 2),
        lambda i, holders: holders[(i // 2) % 2],
        product=lambda gpu: gpu.catalog_product,
        pool_prefix="dp-",
    )


def _churn(churn: PodChurn, held, projects, rng: random.Random) -> None:
    namespace = {p.pk: p.namespace for p in projects}
    for node, holders in sorted(held.items()):
        for project_id, units in holders.items():
            resource = units[0][0] if units else GPU_RESOURCE
            if resource == GPU_RESOURCE and len(units) >= 2:
                churn.run(namespace[project_id], node, resource, 2)  # one pod, two GPUs
            else:
                for _ in units:
                    churn.run(namespace[project_id], node, resource, 1)
    for pod in rng.sample(list(churn.pods), len(churn.pods) // 3):
        churn.delete(*pod)
    for node, holders in sorted(held.items()):
        for project_id, units in holders.items():
            if units and rng.random() < 0.5:
                churn.run(namespace[project_id], node, units[0][0], 1)
        if rng.random() < 0.3:
            outsider = rng.choice([p for p in projects if p.pk not in holders])
            resource = next(iter(holders.values()))[0][0]
            churn.run(outsider.namespace, node, resource, 1)


def measure_podresources_fleet(nodes: int, projects: int, seed: int) -> dict:
    """The fleet's figures (see the module docstring); runs inside the caller's throwaway database."""
    rng = random.Random(seed)
    state = _scenario(nodes, seed).build(mig_manager_delay=3600)
    server = SimServer(state).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = server.write_kubeconfigs(Path(tmp))[CLUSTER]
            cluster = Cluster.objects.create(name=CLUSTER, kubeconfig_path=str(path))
            first = discover_cluster(cluster.pk, inventory="inline")
            if first.run.status != "succeeded":
                return {"dp_error": f"discovery failed: {first.run.error}"}
            people = [
                Project.objects.get_or_create(
                    slug=f"dp{i:03d}", defaults={"name": f"DP project {i}", "namespace": f"dp-{i:03d}"}
                )[0]
                for i in range(max(3, projects))
            ]
            held = _allocate(cluster, people, rng)
            churn = PodChurn(state, CLUSTER, people, prefix="p")
            _churn(churn, held, people, rng)
            bound = [(namespace, uid, ids) for namespace, _, uid, ids in churn.bound()]

            # The poll cycle: discovery (devices unknown), the named nodes' inventories (PodResources), metrics.
            outcome = discover_cluster(cluster.pk, inventory="none")
            api_url = server.cluster_url(CLUSTER)
            attributed = inventory_nodes(cluster.pk, outcome.sync.inventory_nodes, api_url=api_url)
            at = timezone.now()
            interval = timedelta(seconds=settings.METRICS_INTERVAL_S)
            node_ids = list(NodeCapacity.objects.for_cluster(cluster).present().values_list("pk", flat=True))
            for k in reversed(range(settings.MONITORING_TRESPASS_POLLS)):
                for node_id in node_ids:
                    poll_node(node_id, at=at - k * interval)
            detect_trespass(cluster.pk, at=at)
            return {
                "dp_nodes": len(node_ids),
                "dp_pods": len(bound),
                "dp_device_pairs": sum(len(ids) for _, _, ids in bound),
                "dp_multi_device_pods": sum(1 for _, _, ids in bound if len(ids) > 1),
                "dp_inventory_nodes": len(outcome.sync.inventory_nodes),
                "dp_nvml_attributions": attributed.workloads_resolved,
                **_figures(cluster, bound),
            }
    finally:
        server.stop()


def _figures(cluster: Cluster, bound) -> dict:
    active = Allocation.objects.active().filter(gpu__node__cluster=cluster)
    owner = dict(active.filter(mig_instance__isnull=False).values_list("mig_instance__uuid", "project"))
    owner.update(active.filter(mig_instance__isnull=True).values_list("gpu__uuid", "project"))
    units = {
        uuid: (gpu_id, pk)
        for pk, uuid, gpu_id in MigInstance.objects.active()
        .filter(gpu__node__cluster=cluster)
        .values_list("id", "uuid", "gpu_id")
    }
    gpus = GpuCapacity.objects.filter(node__cluster=cluster).values_list("id", "uuid")
    units.update({uuid: (pk, None) for pk, uuid in gpus})
    projects = dict(Project.objects.values_list("namespace", "id"))
    truth, busy = set(), set()
    for namespace, uid, ids in bound:
        for device in ids:
            busy.add(device)
            if owner.get(device) != projects.get(namespace):
                truth.add((unit_key(units[device]), uid))

    mirrored: dict[str, tuple[set, set]] = {}
    for uid, ids, project_id in (
        WorkloadProfile.objects.running().filter(cluster=cluster).values_list("pod_uid", "device_ids", "project_id")
    ):
        devices, owners = mirrored.setdefault(uid, (set(), set()))
        devices.update(ids or ())
        owners.add(project_id)
    errors = sum(
        1 for namespace, uid, ids in bound if mirrored.get(uid, (set(), set())) != (set(ids), {projects.get(namespace)})
    )
    found = set(TrespassEvent.objects.open().filter(gpu__node__cluster=cluster).values_list("unit_key", "pod_uid"))
    in_use = set(active.in_use().values_list("pk", flat=True))
    in_use_errors = sum(
        1
        for pk, mig_uuid, gpu_uuid in active.values_list("pk", "mig_instance__uuid", "gpu__uuid")
        if ((mig_uuid or gpu_uuid) in busy) != (pk in in_use)
    )
    return {
        "dp_attribution_errors": errors,
        "dp_trespass_injected": len(truth),
        "dp_trespass_detected": len(found & truth),
        "dp_false_trespass": len(found - truth),
        "dp_in_use_errors": in_use_errors,
    }

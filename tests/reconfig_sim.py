"""Shared set-up for the MIG reconfiguration tests: an in-process simulator with a small cluster,
mirrored into the database by discovery. Not a test module (no test_ prefix)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from sim_pods import run_gpu_pod

from capacity.mig.catalog import PRODUCTS
from capacity.models import Cluster, GpuCapacity, MigInstance, NodeCapacity
from capacity.services.discovery import discover_cluster
from simcluster import gpuoperator
from simcluster.apiserver import SimServer
from simcluster.gpuoperator import plan_for_gpu
from simcluster.state import SimState


@dataclass
class Sim:
    state: SimState
    server: SimServer
    cluster: Cluster  # the database row

    @property
    def sim_cluster(self):
        return self.state.cluster(self.cluster.name)

    def node(self, name: str):
        return self.sim_cluster.nodes[name]

    def discover(self) -> None:
        """Mirror the simulated cluster into the database (nodes, GPUs, MIG instances)."""
        outcome = discover_cluster(self.cluster.pk, inventory="inline")
        assert outcome.run.status == "succeeded", outcome.run.error

    def run_mig_manager(self) -> None:
        self.state.run_mig_manager()

    def add_gpu_pod(self, node: str, name: str, resource: str, namespace: str = "team-a") -> None:
        run_gpu_pod(self.state, self.sim_cluster, namespace, name, node=node, resource=resource)

    def layout(self, node: str, index: int) -> list[tuple[str, int]]:
        """(profile, start) of the GPU's instances in the simulator, by start."""
        gpu = self.node(node).gpu(index)
        return sorted(((gi.profile.name, gi.start) for gi in gpu.instances.values()), key=lambda x: x[1])

    def db_layout(self, node: str, index: int) -> list[tuple[str, int]]:
        gpu = GpuCapacity.objects.get(node__name=node, index=index, lost_at__isnull=True)
        return [
            (i.profile.name, i.placement_start)
            for i in MigInstance.objects.active().filter(gpu=gpu).select_related("profile").order_by("placement_start")
        ]


def add_node(state: SimState, cluster_name: str, name: str, product: str, gpus: int, layouts=None, group=""):
    """A GPU node with the operator's labels, MIG mixed strategy and optional per-GPU layouts."""
    cluster = state.cluster(cluster_name)
    with state.lock:
        labels = {"gpuaas.io/node-group": group} if group else {}
        node = cluster.add_node(name, PRODUCTS[product], gpus, mig_strategy="mixed", labels=labels)
        node.labels.update(gpuoperator.operator_labels(node))
        for index, names in (layouts or {}).items():
            gpu = node.gpu(index)
            gpu.mig_current = gpu.mig_pending = 1
            counts = {}
            for n in names:
                counts[n] = counts.get(n, 0) + 1
            gpu.apply_layout(plan_for_gpu(gpu.product, counts))
        gpuoperator.refresh_node(cluster, node)
    return node


_names = itertools.count(1)


def start_sim(
    tmp_path: Path,
    nodes,
    *,
    cluster_name: str = "",
    mig_manager_delay: float = 3600,
    device_plugin_restart: bool = True,
    configmap_sync_delay: float = 0.0,
    mig_mode_reboot: bool = False,
) -> Sim:
    """Start a SimServer with `nodes` [(name, product, gpus, layouts, group)] and mirror it into the DB.

    The MIG manager never fires on its own (delay of an hour) unless told: tests call sim.run_mig_manager().
    The device plugin is the real one's kind (keeps its devices until its pod restarts); the mounted
    ConfigMap refresh and the MIG mode reboot are kind unless a test asks (docs/simcluster.md).
    Each simulator gets a cluster name of its own: simcluster.gpuoperator caches parsed ConfigMaps
    by (cluster name, ConfigMap, resourceVersion) across SimStates of one process.
    """
    cluster_name = cluster_name or f"lab{next(_names)}"
    state = SimState(
        seed=7,
        mig_manager_delay=mig_manager_delay,
        device_plugin_restart=device_plugin_restart,
        configmap_sync_delay=configmap_sync_delay,
        mig_mode_reboot=mig_mode_reboot,
    )
    state.add_cluster(cluster_name)
    for spec in nodes:
        add_node(state, cluster_name, *spec)
    server = SimServer(state).start()
    path = server.write_kubeconfigs(tmp_path)[cluster_name]
    cluster = Cluster.objects.create(name=cluster_name, kubeconfig_path=str(path))
    sim = Sim(state, server, cluster)
    sim.discover()
    return sim


def node_row(name: str) -> NodeCapacity:
    return NodeCapacity.objects.get(name=name)


def serve_agent(reconf) -> str:
    """Do what the node agent does with the reconfiguration's MIG command, in this process (nobody serves the
    node's queue in these tests): carry it out, then record its result as the control plane's task would."""
    from capacity.adapters import kubernetes as kube
    from capacity.agent import node as agent
    from operations.reconfiguration.commands import record_result

    reconf.refresh_from_db()
    return record_result(agent.apply_mig(reconf.agent_command, api_url=kube.api_url_for(reconf.cluster)))


def serve_inventory(reconf) -> dict:
    """Do what the node agent and the ingest worker do with an inventory request (apply's and verify's on the
    operator path), in this process: read the node's NVML, sign it, check and reconcile the signed report."""
    from capacity.adapters import kubernetes as kube
    from capacity.agent import node as agent
    from capacity.services.inventory import ingest_inventory_reports

    report = agent.read_inventory(reconf.cluster.name, reconf.node.name, api_url=kube.api_url_for(reconf.cluster))
    results, refused = ingest_inventory_reports([report])
    assert not refused, refused
    return results


def answer_inventory_request(reconf, outcome: str) -> None:
    """After a step ran (reconf as it was before): on the operator path, apply's success and a waiting verify
    asked the node agent for an inventory; serve it (serve_inventory)."""
    if reconf.backend == "operator" and (reconf.step, outcome) in (("apply", "advanced"), ("verify", "waiting")):
        serve_inventory(reconf)


def drive(sim: Sim | None, reconf, *, max_calls: int = 20) -> list[str]:
    """Call the step task for the reconfiguration's current step until it succeeds or fails.

    When apply waits on the operator path, the simulated MIG manager runs once (it never fires on
    its own in these tests); on the agent path the node agent's work runs in this process (serve_agent).
    On the operator path, the inventory that apply (on success) and a waiting verify ask the node agent
    for is served in this process (serve_inventory). Returns the outcomes, in order.
    """
    from operations.tasks import reconfiguration_step_task

    outcomes = []
    for _ in range(max_calls):
        reconf.refresh_from_db()
        if reconf.state in ("succeeded", "failed", "rolled_back", "cancelled"):
            break
        outcome = reconfiguration_step_task(reconf.pk, reconf.step)
        outcomes.append(f"{reconf.step}:{outcome}")
        if outcome == "waiting" and reconf.step == "apply" and reconf.backend == "agent":
            serve_agent(reconf)
        elif outcome == "waiting" and reconf.step == "apply" and sim is not None:
            sim.run_mig_manager()
        answer_inventory_request(reconf, outcome)
    reconf.refresh_from_db()
    return outcomes


def allocate(gpu: GpuCapacity, *, mig_start: int | None = None, project=None, kind: str = "mig"):
    """An active Allocation of one unit of `gpu` (the MIG instance at `mig_start`, or the whole GPU)."""
    from pools.models import Allocation, GpuPool, PoolRequest
    from tenancy.models import Project

    project = (
        project or Project.objects.get_or_create(slug="team-a", defaults={"name": "Team A", "namespace": "team-a"})[0]
    )
    request = PoolRequest.objects.create(project=project, product=gpu.catalog_product, state="active", count=1)
    pool = GpuPool.objects.create(
        project=project, request=request, cluster=gpu.node.cluster, name=f"pool-{request.pk}", workload_type="inference"
    )
    instance = None
    if kind == "mig":
        instance = MigInstance.objects.active().get(gpu=gpu, placement_start=mig_start)
    return Allocation.objects.create(
        pool=pool,
        project=project,
        kind=kind,
        gpu=gpu,
        mig_instance=instance,
        resource_name=instance.profile.resource_name if instance else "nvidia.com/gpu",
        product=gpu.catalog_product,
        profile_name=instance.profile.name if instance else "",
        compute_slices=instance.profile.compute_slices if instance else 7,
    )


def mig_demand(cluster, product: str = "H100-80GB", **units) -> None:
    """Active MIG pool requests of team-a on `cluster`, started three days ago: `1g_10gb=6` asks 6 x 1g.10gb."""
    from django.utils import timezone

    from pools.models import PoolRequest
    from tenancy.models import Project

    project = Project.objects.get_or_create(slug="team-a", defaults={"name": "Team A", "namespace": "team-a"})[0]
    for profile, count in units.items():
        PoolRequest.objects.create(
            project=project,
            cluster=cluster,
            product=product,
            spec_kind="mig",
            profile_name=profile.replace("_", "."),
            count=count,
            state="active",
            start_at=timezone.now() - timedelta(days=3),
        )


def gpu_row(node: str, index: int) -> GpuCapacity:
    return GpuCapacity.objects.get(node__name=node, index=index, lost_at__isnull=True)

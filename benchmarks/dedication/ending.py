"""Reservations that end and loans given back, measured against the simulator (`bench dedication`, issue #25).

A fleet of its own (`ending`: H100 nodes of 8 GPUs with 2 x 3g.40gb each, 16 units a node, device plugin),
in the caller's throwaway database. Each node is held whole by one project (allocations written straight
into the mirror, as `bench dedication` does), and the clock is simulated: every poll advances it by the
beat's period and runs, as the beat would, one discovery (the workload mirror) then the service under test
with `now=` that time. What is measured is the simulator's own truth (its pods and the devices they hold),
read after each poll: a pod is counted as gone at the poll that removed it.

Ending (half of the nodes): the holder runs pods on 10 of its 16 units; on one node in four one of those pods
is protected by a PodDisruptionBudget (minAvailable 1). All its allocations end at T0 (released_at = T0), and
`pools.ending.sweep_ending` runs every ALLOCATION_ENDING_SWEEP_S until no pod of it is left on the units.

- pods_outliving_allocation_s_max: the longest a pod of the project stayed on an ended unit, over the pods no
  budget protects (target: ALLOCATION_ENDING_GRACE_S + one sweep period, `ending_target_s`);
- pdb_pods_outliving_s_max: the same for the budget-protected pods, which are evicted when the budget
  allows or deleted at the hard deadline (target: grace + ALLOCATION_ENDING_FORCE_AFTER_S + one period);
- units_handed_out_while_ending: ended units that capacity's free() offered before they were empty (0).

Loans (the other half): the holder turns lending on and lends 4 of its units to another project, which runs 4
pods on the node (2 of the borrowed PriorityClass, 2 without); the holder fills its other 12 units and then
starts 1 or 2 more pods, which stay Pending. `pools.lending.reconcile_loans` runs every
LENDING_RECONCILE_INTERVAL_S.

- loan_overstay_s_max: per node, from the first reclaim until the borrower holds on the node no more devices
  than its loans still granted (target: LENDING_RECLAIM_GRACE_S + one period, `loan_target_s`);
- reclaimed_units_beyond_need: loans taken back beyond what the holder's Pending pods needed, summed (0);
- lender_pods_pending_after: the holder's pods still Pending when the loop ends (0).
"""

from __future__ import annotations

import random
import tempfile
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest import mock

from django.conf import settings
from django.test.utils import override_settings

from capacity.models import Cluster, MigInstance
from capacity.services.discovery import discover_cluster
from capacity.services.inventory import inventory_nodes
from pools.choices import LoanState
from pools.ending import sweep_ending
from pools.lending import reconcile_loans
from pools.models import Allocation, GpuPool, Loan, PoolRequest
from pools.provisioning import BORROWED_PRIORITY_CLASS
from simcluster import SimServer
from simcluster.kube import ClusterApi
from simcluster.scenarios import Scenario
from simcluster.scheduler import assigned_devices
from tenancy.models import Project

CLUSTER = "ending"
RESOURCE = "nvidia.com/mig-3g.40gb"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _state(nodes: int, seed: int):
    return Scenario.from_dict(
        {
            "name": CLUSTER,
            "seed": seed,
            "clusters": [
                {
                    "name": CLUSTER,
                    "node_groups": [
                        {
                            "name_prefix": "end",
                            "count": nodes,
                            "product": "H100-80GB",
                            "gpus_per_node": 8,
                            "mig_strategy": "mixed",
                            "mig_layout": ["3g.40gb", "3g.40gb"],
                        }
                    ],
                }
            ],
        }
    ).build(mig_manager_delay=3600)


class World:
    def __init__(self, state, cluster: Cluster, api_url: str):
        self.state = state
        self.api_url = api_url
        self.sim = state.cluster(CLUSTER)
        self.api = ClusterApi(self.sim)
        self.cluster = cluster

    def namespace(self, name: str) -> None:
        with self.state.lock:
            self.api.create("namespaces", None, {"metadata": {"name": name}})

    def pod(self, namespace: str, name: str, node: str, *, priority: str = "", labels: dict | None = None) -> None:
        spec = {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {RESOURCE: "1"}}}],
        }
        if priority:
            spec["priorityClassName"] = priority
        with self.state.lock:
            self.api.create("pods", namespace, {"metadata": {"name": name, "labels": labels or {}}, "spec": spec})

    def budget(self, namespace: str, name: str, labels: dict) -> None:
        body = {"metadata": {"name": name}, "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}}
        with self.state.lock:
            self.api.create("poddisruptionbudgets", namespace, body)

    def pods(self) -> list[tuple[str, str, str, str, list[str]]]:
        """(namespace, name, node, phase, device ids) of every pod."""
        with self.state.lock:
            out = []
            for (namespace, name), record in self.sim.pods.items():
                spec, status = record.obj["spec"], record.obj.get("status") or {}
                ids = assigned_devices(self.sim, namespace, name)  # what the kubelet's PodResources lists
                out.append((namespace, name, spec.get("nodeName") or "", status.get("phase") or "", ids))
            return out

    def poll(self) -> None:
        """Discovery, then the inventories (PodResources) of the nodes it names: how a pod's devices are learnt."""
        outcome = discover_cluster(self.cluster.pk, inventory="none")
        if outcome.run.status != "succeeded":
            raise RuntimeError(f"discovery failed: {outcome.run.error}")
        if outcome.sync.inventory_nodes:
            with override_settings(NVML_LIBRARY="benchmarks.capacity.snapshot_nvml"):
                inventory_nodes(self.cluster.pk, outcome.sync.inventory_nodes, api_url=self.api_url)


def _hold(world: World, node: str, project: Project) -> tuple[GpuPool, list[Allocation]]:
    """`project` holds the node's 16 units (written straight into the mirror)."""
    request = PoolRequest.objects.create(project=project, product="H100-80GB", state="active", count=16)
    pool = GpuPool.objects.create(
        project=project, request=request, cluster=world.cluster, name=f"whole-{node}", workload_type="inference"
    )
    instances = MigInstance.objects.active().filter(gpu__node__cluster=world.cluster, gpu__node__name=node)
    rows = [
        Allocation(
            pool=pool,
            project=project,
            kind="mig",
            gpu=i.gpu,
            mig_instance=i,
            resource_name=RESOURCE,
            product="H100-80GB",
            profile_name="3g.40gb",
            compute_slices=3,
        )
        for i in instances.select_related("gpu", "profile").order_by("gpu__index", "placement_start")
    ]
    return pool, Allocation.objects.bulk_create(rows)


def measure_ending_and_loans(nodes: int, seed: int = 25) -> dict:
    """Build the world, run both loops, return the figures (see the module docstring)."""
    rng = random.Random(seed)
    nodes = max(2, nodes)
    state = _state(nodes, seed)
    server = SimServer(state).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = server.write_kubeconfigs(Path(tmp))[CLUSTER]
            cluster = Cluster.objects.create(name=CLUSTER, kubeconfig_path=str(path))
            with override_settings(NVML_LIBRARY="benchmarks.capacity.snapshot_nvml"):
                run = discover_cluster(cluster.pk, inventory="inline").run
            if run.status != "succeeded":
                return {"error": f"discovery failed: {run.error}"}
            world = World(state, cluster, server.cluster_url(CLUSTER))
            names = sorted(n.name for n in cluster.nodes.all())
            ending_nodes, loan_nodes = names[: len(names) // 2], names[len(names) // 2 :]
            # reconcile_loans reconciles each borrower itself; the task it also enqueues would go to the broker.
            with mock.patch("pools.tasks.reconcile_project_task.delay_on_commit"):
                figures = _ending(world, ending_nodes)
                figures.update(_loans(world, loan_nodes, rng))
            return figures
    finally:
        server.stop()


def _ending(world: World, nodes: list[str]) -> dict:
    period = timedelta(seconds=settings.ALLOCATION_ENDING_SWEEP_S)
    grace = settings.ALLOCATION_ENDING_GRACE_S
    protected: set[tuple[str, str]] = set()
    ended: list[int] = []
    for i, node in enumerate(nodes):
        project = Project.objects.create(slug=f"end-{i}", name=f"Ending {i}", namespace=f"end-{i}")
        world.namespace(project.namespace)
        _, units = _hold(world, node, project)
        ended += [u.pk for u in units]
        for k in range(10):
            labels = {"app": "kept"} if (i % 4 == 0 and k == 0) else {}
            world.pod(project.namespace, f"w{k}", node, labels=labels)
            if labels:
                protected.add((project.namespace, f"w{k}"))
        if i % 4 == 0:
            world.budget(project.namespace, "kept", {"app": "kept"})
    world.poll()
    namespaces = {f"end-{i}" for i in range(len(nodes))}
    alive = {(ns, name) for ns, name, _, phase, ids in world.pods() if ns in namespaces and ids}
    Allocation.objects.filter(pk__in=ended).update(released_at=T0, end_reason="bench: the reservation ended")
    instance_ids = list(Allocation.objects.filter(pk__in=ended).values_list("mig_instance_id", flat=True))
    gone_at: dict[tuple[str, str], float] = {}
    handed_out = 0
    limit = grace + settings.ALLOCATION_ENDING_FORCE_AFTER_S + 10 * period.total_seconds()
    now = T0
    while Allocation.objects.filter(pk__in=ended).ending().exists() and (now - T0).total_seconds() <= limit:
        handed_out += (
            MigInstance.objects.free()
            .filter(pk__in=instance_ids, allocations__in=Allocation.objects.filter(pk__in=ended).ending())
            .count()
        )
        world.poll()
        sweep_ending(world.cluster, now=now)
        present = {(ns, name) for ns, name, _, _, ids in world.pods() if ns in namespaces and ids}
        for pod in alive - present:
            gone_at.setdefault(pod, (now - T0).total_seconds())
        now += period
    open_pods = alive - set(gone_at)
    plain = [s for pod, s in gone_at.items() if pod not in protected]
    kept = [s for pod, s in gone_at.items() if pod in protected]
    return {
        "ending_units": len(ended),
        "ending_pods": len(alive),
        "ending_pods_left": len(open_pods),
        "pods_outliving_allocation_s_max": max(plain, default=0.0),
        "pdb_pods_outliving_s_max": max(kept, default=0.0),
        "units_still_ending": Allocation.objects.filter(pk__in=ended).ending().count(),
        "units_handed_out_while_ending": handed_out,
        "ending_target_s": grace + period.total_seconds(),
        "pdb_target_s": grace + settings.ALLOCATION_ENDING_FORCE_AFTER_S + period.total_seconds(),
    }


def _loans(world: World, nodes: list[str], rng: random.Random) -> dict:
    period = timedelta(seconds=settings.LENDING_RECONCILE_INTERVAL_S)
    grace = settings.LENDING_RECLAIM_GRACE_S
    need: dict[str, int] = {}
    lenders: dict[str, Project] = {}
    borrowers: dict[str, Project] = {}
    loans_of: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        lender = Project.objects.create(slug=f"lend-{i}", name=f"Lender {i}", namespace=f"lend-{i}")
        borrower = Project.objects.create(slug=f"borrow-{i}", name=f"Borrower {i}", namespace=f"borrow-{i}")
        world.namespace(lender.namespace)
        world.namespace(borrower.namespace)
        pool, units = _hold(world, node, lender)
        GpuPool.objects.filter(pk=pool.pk).update(lending_enabled=True)
        for unit in units[:4]:
            loan = Loan.objects.create(allocation=unit, lender_pool=pool, borrower=borrower, started_at=T0)
            loans_of[node].append(loan.pk)
        for k in range(4):
            world.pod(borrower.namespace, f"b{k}", node, priority=BORROWED_PRIORITY_CLASS if k % 2 else "")
        for k in range(12):
            world.pod(lender.namespace, f"a{k}", node)
        need[node] = rng.choice((1, 2))
        for k in range(need[node]):
            world.pod(lender.namespace, f"more{k}", node)
        lenders[node], borrowers[node] = lender, borrower
    pending_before = sum(1 for ns, _, _, phase, _ in world.pods() if ns.startswith("lend-") and phase == "Pending")
    started: dict[str, float] = {}
    returned: dict[str, float] = {}
    limit = grace + 10 * period.total_seconds()
    now = T0 + timedelta(seconds=1)
    while (now - T0).total_seconds() <= limit:
        world.poll()
        reconcile_loans(world.cluster, now=now)
        elapsed = (now - T0).total_seconds()
        held: dict[str, int] = defaultdict(int)
        for ns, _, node, phase, ids in world.pods():
            if ns.startswith("borrow-") and phase == "Running":
                held[node] += len(ids)
        for node in nodes:
            states = list(Loan.objects.filter(pk__in=loans_of[node]).values_list("state", "reclaim_requested_at"))
            if node not in started and any(at is not None for _, at in states):
                started[node] = min((at - T0).total_seconds() for _, at in states if at is not None)
            granted = sum(1 for state, _ in states if state == LoanState.ACTIVE)
            if node in started and node not in returned and held[node] <= granted:
                returned[node] = elapsed - started[node]
        if len(returned) == len(nodes):
            break
        now += period
    beyond = 0
    for node in nodes:
        taken = Loan.objects.filter(pk__in=loans_of[node]).exclude(state=LoanState.ACTIVE).count()
        beyond += max(0, taken - need[node])
    pending_after = sum(1 for ns, _, _, phase, _ in world.pods() if ns.startswith("lend-") and phase == "Pending")
    return {
        "loans": sum(len(v) for v in loans_of.values()),
        "lender_pods_pending_before": pending_before,
        "loans_reclaimed": Loan.objects.filter(pk__in=[p for v in loans_of.values() for p in v])
        .exclude(state=LoanState.ACTIVE)
        .count(),
        "units_needed": sum(need.values()),
        "reclaimed_units_beyond_need": beyond,
        "loan_overstay_s_max": max(returned.values(), default=0.0),
        "loans_not_returned": len(nodes) - len(returned),
        "lender_pods_pending_after": pending_after,
        "loan_target_s": grace + period.total_seconds(),
    }

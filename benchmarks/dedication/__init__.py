"""`python manage.py bench dedication`: trespass detection and attribution by device on a shared fleet.

In a throwaway database (benchmarks.pools.bench_database) and an in-process simulator (SimServer):
NODES H100 nodes of 8 GPUs, half with MIG (2 x 3g.40gb per GPU), half whole GPUs; PROJECTS projects
share them (two or three per node, one unit per node left unallocated); allocations are written
straight into the mirror. Then a churn of pods through the simulator's API server: each holder runs
pods on its node up to its units there, a third of them are deleted, a second wave arrives and some
projects run pods on nodes where they hold nothing (they ask for units of others). The simulated
device plugin binds by count, so it hands out whichever devices are free.

One poll cycle: discovery mirrors the pods (WorkloadProfile), then the trespass check runs once.

- trespass_injected: (pod, device) pairs the simulator bound where the device's unit is not held by
  the pod's project, read from the simulated kubelet's assignments and the allocations;
- trespass_detected: open trespass events matching such a pair; false_trespass: open events that
  match none (both by (unit, pod uid));
- attribution_errors: pods whose mirrored usage (WorkloadProfile unit and project) differs from
  the device the simulator gave them and their namespace's project;
- dra_wrong_device: benchmarks.dedication.dra on a DRA fleet of the same size (pods that got a device outside
  their claim: must be 0), with dra_pods and dra_forged_obtained_foreign (hand-written claims, see dra.md);
- detect_s: wall time of the trespass check for the cycle (target: at most 2 s at 200 nodes).

The pods' devices reach gpuaas only through each node's kubelet PodResources socket: the cycle's discovery
names the nodes with pods of unknown devices and their inventories (PodResources) follow, as the agents'
would. The `dp_*` figures are a second, device-plugin fleet of H100 and H200 nodes with multi-GPU pods and
idle units that read like real idle boards, attributed only by PodResources
(benchmarks/dedication/podresources.py).
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

from django.test.utils import override_settings

from capacity.models import Cluster, GpuCapacity, MigInstance, WorkloadProfile
from capacity.services.discovery import discover_cluster
from capacity.services.inventory import inventory_nodes
from monitoring.models import TrespassEvent
from monitoring.services.trespass import detect_trespass, unit_key
from pools.models import Allocation
from simcluster import SimServer
from simcluster.scenarios import Scenario
from tenancy.models import Project

from ..pools import bench_database
from ..registry import Smoke, arg, benchmark
from ..targets import correctness, performance
from .dealt_units import GPU_RESOURCE, PodChurn, deal
from .dra import measure_dra_wrong_device
from .ending import measure_ending_and_loans
from .podresources import measure_podresources_fleet

CLUSTER = "dedication"
MIG_RESOURCE = "nvidia.com/mig-3g.40gb"


def _scenario(nodes: int) -> Scenario:
    mig_nodes = nodes // 2
    return Scenario.from_dict(
        {
            "name": CLUSTER,
            "seed": 15,
            "clusters": [
                {
                    "name": CLUSTER,
                    "node_groups": [
                        {
                            "name_prefix": "mig",
                            "count": mig_nodes,
                            "product": "H100-80GB",
                            "gpus_per_node": 8,
                            "mig_strategy": "mixed",
                            "mig_layout": ["3g.40gb", "3g.40gb"],
                        },
                        {
                            "name_prefix": "full",
                            "count": nodes - mig_nodes,
                            "product": "H100-80GB",
                            "gpus_per_node": 8,
                            "mig_strategy": "mixed",
                        },
                    ],
                }
            ],
        }
    )


def _allocate(cluster: Cluster, projects: list[Project], rng: random.Random) -> dict[str, dict[int, list[str]]]:
    """Share every node between two or three projects, one unit per node left free. Returns
    {node name: {project id: [device uuids held]}}."""
    held = deal(
        cluster,
        lambda: rng.sample(projects, rng.choice((2, 3))),
        lambda i, holders: holders[i % len(holders)],
        product=lambda gpu: "H100-80GB",
    )
    return {node: {pk: [uuid for _, uuid in units] for pk, units in holders.items()} for node, holders in held.items()}


def _resource(node: str) -> str:
    return MIG_RESOURCE if node.startswith("mig") else GPU_RESOURCE


def _churn(churn: PodChurn, held, projects, rng: random.Random) -> None:
    namespace = {p.pk: p.namespace for p in projects}
    for node, holders in sorted(held.items()):  # first wave: every holder fills its units but one
        for project_id, devices in holders.items():
            for _ in range(max(0, len(devices) - 1)):
                churn.run(namespace[project_id], node, _resource(node))
    for pod in rng.sample(list(churn.pods), len(churn.pods) // 3):
        churn.delete(*pod)
    for node, holders in sorted(held.items()):  # second wave: some come back, some go elsewhere
        for project_id in holders:
            if rng.random() < 0.5:
                churn.run(namespace[project_id], node, _resource(node))
        if rng.random() < 0.2:
            outsider = rng.choice([p for p in projects if p.pk not in holders])
            churn.run(outsider.namespace, node, _resource(node))


def _truth(cluster: Cluster, bound) -> tuple[set, dict]:
    """The trespasses the simulator actually bound, {(unit key, pod uid)}, and each pod's expected usage."""
    active = Allocation.objects.active()
    owner: dict[str, int] = dict(active.filter(mig_instance__isnull=False).values_list("mig_instance__uuid", "project"))
    owner.update(active.filter(mig_instance__isnull=True).values_list("gpu__uuid", "project"))
    units: dict[str, tuple[int, int | None]] = {}
    for pk, uuid, gpu_id in (
        MigInstance.objects.active().filter(gpu__node__cluster=cluster).values_list("id", "uuid", "gpu_id")
    ):
        units[uuid] = (gpu_id, pk)
    for pk, uuid in GpuCapacity.objects.filter(node__cluster=cluster).values_list("id", "uuid"):
        units[uuid] = (pk, None)
    projects = dict(Project.objects.values_list("namespace", "id"))
    trespass, expected = set(), {}
    for namespace, _, uid, ids in bound:
        project_id = projects.get(namespace)
        expected[uid] = (units[ids[0]], project_id)
        for device in ids:
            if owner.get(device) != project_id:
                trespass.add((unit_key(units[device]), uid))
    return trespass, expected


def _attribution_errors(cluster: Cluster, expected: dict) -> int:
    mirrored = {
        uid: ((gpu_id, mig_id), project_id)
        for uid, gpu_id, mig_id, project_id in WorkloadProfile.objects.running()
        .filter(cluster=cluster)
        .values_list("pod_uid", "gpu_id", "mig_instance_id", "project_id")
    }
    return sum(1 for uid, want in expected.items() if mirrored.get(uid) != want)


@benchmark(
    "dedication",
    help="Trespass detection and attribution by device on a fleet shared by projects (one poll cycle).",
    arguments=[
        arg("--nodes", type=int, default=200),
        arg("--projects", type=int, default=50),
        arg("--ending-nodes", type=int, default=20, help="Nodes of the ending and loans fleet (half each)"),
        arg("--keep-db", action="store_true", help="Keep the throwaway database"),
        arg("--dp-nodes", type=int, default=24, help="Nodes of the PodResources-only H100/H200 fleet (0: none)"),
    ],
    targets=[
        correctness("trespass_detected", "==", "trespass_injected"),
        correctness("false_trespass", "==", 0),
        correctness("attribution_errors", "==", 0),
        correctness("dra_wrong_device", "==", 0),
        correctness("dra_forged_obtained_foreign", "==", 0),
        correctness("dp_attribution_errors", "==", 0),
        correctness("dp_false_trespass", "==", 0),
        correctness("dp_trespass_detected", "==", "dp_trespass_injected"),
        correctness("dp_nvml_attributions", "==", 0),
        correctness("dp_in_use_errors", "==", 0),
        performance("detect_s", "<=", 2),
        correctness("pods_outliving_allocation_s_max", "<=", "ending_target_s"),
        correctness("pdb_pods_outliving_s_max", "<=", "pdb_target_s"),
        correctness("ending_pods_left", "==", 0),
        correctness("units_handed_out_while_ending", "==", 0),
        correctness("loan_overstay_s_max", "<=", "loan_target_s"),
        correctness("loans_not_returned", "==", 0),
        correctness("reclaimed_units_beyond_need", "==", 0),
        correctness("lender_pods_pending_after", "==", 0),
    ],
    smoke=Smoke(("--nodes", "6", "--projects", "4", "--ending-nodes", "4", "--dp-nodes", "4")),
)
def dedication(
    *, stdout=None, nodes: int, projects: int, ending_nodes: int = 20, keep_db: bool = False, dp_nodes: int = 24, **_
) -> dict:
    rng = random.Random(15)
    state = _scenario(nodes).build(mig_manager_delay=3600)
    server = SimServer(state).start()
    try:
        with bench_database(keep_db), tempfile.TemporaryDirectory() as tmp:
            path = server.write_kubeconfigs(Path(tmp))[CLUSTER]
            cluster = Cluster.objects.create(name=CLUSTER, kubeconfig_path=str(path))
            with override_settings(NVML_LIBRARY="benchmarks.capacity.snapshot_nvml"):
                started = time.perf_counter()
                outcome = discover_cluster(cluster.pk, inventory="inline")
                first_sync_s = time.perf_counter() - started
            if outcome.run.status != "succeeded":
                return {"error": f"discovery failed: {outcome.run.error}"}
            people = [
                Project.objects.create(slug=f"p{i:03d}", name=f"Project {i}", namespace=f"team-{i:03d}")
                for i in range(projects)
            ]
            held = _allocate(cluster, people, rng)
            churn = PodChurn(state, CLUSTER, people, prefix="w")
            _churn(churn, held, people, rng)
            bound = churn.bound()
            truth, expected = _truth(cluster, bound)

            started = time.perf_counter()  # the poll cycle: workloads mirrored, then the trespass check
            outcome = discover_cluster(cluster.pk, inventory="none")
            with override_settings(NVML_LIBRARY="benchmarks.capacity.snapshot_nvml"):  # + the kubelets' answers
                inventory_nodes(cluster.pk, outcome.sync.inventory_nodes, api_url=server.cluster_url(CLUSTER))
            sync_s = time.perf_counter() - started
            started = time.perf_counter()
            detect_trespass(cluster.pk)
            detect_s = time.perf_counter() - started

            # The same fleet size under DRA (benchmarks.dedication.dra): no pod may get a device outside its claim.
            units_allocated = Allocation.objects.active().count()
            dra = measure_dra_wrong_device(nodes, projects, 15, rounds=2)
            found = set(
                TrespassEvent.objects.open()
                .filter(gpu__node__cluster=cluster)
                .exclude(pod_uid="")
                .values_list("unit_key", "pod_uid")
            )
            attribution_errors = _attribution_errors(cluster, expected)
            fleet = measure_podresources_fleet(dp_nodes, max(3, projects // 10), 15) if dp_nodes else {}
            ending = measure_ending_and_loans(ending_nodes)
            return {
                "nodes": nodes,
                "projects": projects,
                "units_allocated": units_allocated,
                "pods_running": len(bound),
                "trespass_injected": len(truth),
                "trespass_detected": len(found & truth),
                "false_trespass": len(found - truth),
                "attribution_errors": attribution_errors,
                "dra_wrong_device": dra["dra_wrong_device"],
                "dra_pods": dra["pods_created"],
                "dra_forged_refused": dra["forged_refused"],
                "dra_forged_obtained_foreign": dra["forged_obtained_foreign"],
                "detect_s": round(detect_s, 3),
                "workload_sync_s": round(sync_s, 3),
                "first_sync_s": round(first_sync_s, 3),
                **ending,
                **fleet,
            }
    finally:
        server.stop()

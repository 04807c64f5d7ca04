"""`python manage.py bench maintenance`: take a loaded node offline on a simulated fleet with drain-and-move.

Builds --nodes simulated nodes of --gpus-per-node H100-80GB, each GPU at 3g.40gb x 2, served over HTTP
(SimServer, in this process) and mirrored into the database named by DATABASE_URL. --load of every
node's units is reserved by --projects projects (active pools), the drained node (the first) fully, with
one running GPU pod per reservation on it. The drain's step bodies are called here, one after the other
(no broker), on a simulated clock: the notice of --grace-s is honoured without sleeping (the evict step is
called once before the deadline and once at it).

Reported: reservations_moved (of reservations_on_node), reservation_short_s (reservation-seconds during
which a reservation had no unit on a node serving it: sampled after every step call, on the simulated
clock; it must be 0, which is why reservations move before any pod is evicted), evicted_after_grace and
evicted_before_grace (GPU pods gone from the node before/after the deadline), own_node_moves (moves
onto a node the project already used), the drain's wall seconds and SQL queries.
"""

from __future__ import annotations

import tempfile
import time
from datetime import timedelta
from pathlib import Path
from unittest import mock

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from capacity.mig.catalog import PRODUCTS
from capacity.models import Cluster, GpuCapacity, MigInstance, NodeCapacity, NodeDrain
from capacity.services.discovery import discover_cluster
from notifications.models import Event
from operations import maintenance
from pools.models import Allocation, GpuPool, PoolRequest
from simcluster import SimServer, SimState, gpuoperator
from simcluster.kube import ClusterApi
from tenancy.models import Project

from .capacity import delete_bench_clusters, stale_bench_clusters, unique_name
from .registry import Smoke, arg, benchmark
from .targets import correctness, performance

BENCH_PREFIX = "bench-drain-"


def _delete(clusters) -> None:
    projects = list(
        Project.objects.filter(slug__startswith=BENCH_PREFIX, pools__cluster__in=clusters)
        .distinct()
        .values_list("pk", flat=True)
    )
    NodeDrain.objects.filter(cluster__in=clusters).delete()  # steps cascade
    Allocation.objects.filter(gpu__node__cluster__in=clusters).delete()
    GpuPool.objects.filter(cluster__in=clusters).delete()
    Event.objects.filter(project__in=projects).delete()
    PoolRequest.objects.filter(cluster__in=clusters).delete()
    PoolRequest.objects.filter(project__in=projects).delete()
    Project.objects.filter(pk__in=projects).delete()
    delete_bench_clusters(clusters)


def _build(name: str, nodes: int, gpus_per_node: int) -> SimState:
    state = SimState(seed=13, mig_manager_delay=3600)
    cluster = state.add_cluster(name)
    product = PRODUCTS["H100-80GB"]
    with state.lock:
        for i in range(nodes):
            node = cluster.add_node(f"gpu-{i:04d}", product, gpus_per_node, mig_strategy="mixed")
            node.labels.update(gpuoperator.operator_labels(node))
            for gpu in node.gpus:
                gpu.mig_current = gpu.mig_pending = 1
                gpu.apply_layout(gpuoperator.plan_for_gpu(product, {"3g.40gb": 2}))
            gpuoperator.refresh_node(cluster, node)
    return state


def _reserve(cluster: Cluster, name: str, *, projects: int, load: float, drained: str) -> list[Allocation]:
    """Active pools of one 3g.40gb reservation each: every unit of `drained`, `load` of the others'."""
    teams = [
        Project.objects.create(name=f"{name}-{n}", slug=f"{name}-{n}"[:50], namespace=f"{name}-{n}"[:63])
        for n in range(projects)
    ]
    instances = list(
        MigInstance.objects.active()
        .filter(gpu__node__cluster=cluster)
        .select_related("gpu__node", "profile")
        .order_by("gpu__node__name", "gpu__index", "placement_start")
    )
    rows = []
    others = [i for i in instances if i.gpu.node.name != drained]
    chosen = [i for i in instances if i.gpu.node.name == drained] + others[: int(len(others) * load)]
    for n, instance in enumerate(chosen):
        team = teams[n % projects]
        request = PoolRequest.objects.create(
            project=team, cluster=cluster, product="H100-80GB", profile_name="3g.40gb", count=1, state="active"
        )
        pool = GpuPool.objects.create(project=team, request=request, cluster=cluster, name=f"pool-{request.pk}")
        rows.append(
            Allocation(
                pool=pool,
                project=team,
                kind="mig",
                gpu=instance.gpu,
                mig_instance=instance,
                resource_name=instance.profile.resource_name,
                product="H100-80GB",
                profile_name="3g.40gb",
                compute_slices=instance.profile.compute_slices,
            )
        )
    return Allocation.objects.bulk_create(rows)


def _start_pods(state: SimState, name: str, node: str, allocations: list[Allocation]) -> list[tuple[str, str]]:
    cluster = state.cluster(name)
    api = ClusterApi(cluster)
    pods = []
    with state.lock:
        for a in allocations:
            namespace = a.project.namespace
            if namespace not in cluster.namespaces:
                api.create("namespaces", None, {"metadata": {"name": namespace}})
            body = {
                "containers": [{"name": "main", "image": "x", "resources": {"limits": {a.resource_name: "1"}}}],
                "nodeSelector": {"kubernetes.io/hostname": node},
            }
            pod = f"worker-{a.pk}"
            api.create("pods", namespace, {"metadata": {"name": pod, "namespace": namespace}, "spec": body})
            pods.append((namespace, pod))
    return pods


def _running(state: SimState, name: str, pods) -> int:
    cluster = state.cluster(name)
    with state.lock:
        return sum(
            1 for key in pods if key in cluster.pods and not cluster.pods[key].obj["metadata"].get("deletionTimestamp")
        )


def _short(drain: NodeDrain, ids: list[int]) -> int:
    """Reservations (of `ids`) not served now: ended, or on the drained node once its pods are being evicted,
    or on a GPU that is gone or unhealthy."""
    drain.refresh_from_db(fields=["step", "evicted_at"])
    rows = Allocation.objects.filter(pk__in=ids).values_list("released_at", "gpu__node_id", "gpu_id")
    usable = set(GpuCapacity.objects.healthy().filter(node__cluster_id=drain.cluster_id).values_list("pk", flat=True))
    evicting = drain.step in ("evict", "handover", "uncordon", "done")
    return sum(
        1
        for released, node_id, gpu_id in rows
        if released is not None or gpu_id not in usable or (evicting and node_id == drain.node_id)
    )


def run_maintenance_bench(*, nodes: int, gpus_per_node: int, projects: int, load: float, grace_s: int) -> dict:
    _delete(stale_bench_clusters(BENCH_PREFIX))
    name = unique_name(BENCH_PREFIX, nodes)
    patches = [
        mock.patch("operations.tasks.enqueue_drain_step"),  # the steps are called here, one after the other
        mock.patch("pools.tasks.reconcile_project_task.delay_on_commit"),  # the clusters' quotas: not measured
        mock.patch("pools.tasks.process_queue_task.delay_on_commit"),
        mock.patch("notifications.tasks.fan_out_task.delay_on_commit"),
    ]
    for patch in patches:
        patch.start()
    state = _build(name, nodes, gpus_per_node)
    server = SimServer(state).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = server.write_kubeconfigs(Path(tmp))[name]
            cluster = Cluster.objects.create(name=name, kubeconfig_path=str(path))
            outcome = discover_cluster(cluster.pk, inventory="inline")
            if outcome.run.status != "succeeded":
                raise RuntimeError(f"discovery failed: {outcome.run.error}")
            node = NodeCapacity.objects.get(cluster=cluster, name="gpu-0000")
            reserved = _reserve(cluster, name, projects=projects, load=load, drained=node.name)
            on_node = [a for a in reserved if a.gpu.node_id == node.pk]
            ids = [a.pk for a in on_node]
            before = {a.pk: a.project_id for a in on_node}
            others_nodes = {
                (p, n)
                for p, n in Allocation.objects.active()
                .filter(gpu__node__cluster=cluster)
                .exclude(gpu__node=node)
                .values_list("project_id", "gpu__node_id")
            }
            pods = _start_pods(state, name, node.name, on_node)

            clock = timezone.now()
            short_s = 0.0
            evicted_before = 0
            calls = 0
            last = ""
            started = time.perf_counter()
            with CaptureQueriesContext(connection) as captured:
                drain = maintenance.start(node, reason="benchmark", grace_s=grace_s)
                while calls < 40:
                    drain.refresh_from_db()
                    if drain.state in ("succeeded", "failed"):
                        break
                    if drain.step == "handover" and drain.give_back_at is None and calls and last == "waiting":
                        maintenance.give_back(drain)  # the operator's work is done at once
                        continue
                    if drain.step == "evict" and drain.evict_after and clock < drain.evict_after:
                        last = maintenance.run_step(drain.pk, drain.step, token="bench", now=clock)
                        evicted_before += len(pods) - _running(state, name, pods)
                        step_s = (drain.evict_after - clock).total_seconds()
                    else:
                        last = maintenance.run_step(drain.pk, drain.step, token="bench", now=clock)
                        step_s = 1.0  # a step call is counted as one simulated second
                    calls += 1
                    short_s += _short(drain, ids) * step_s
                    clock += timedelta(seconds=step_s)
            wall_s = time.perf_counter() - started
            drain.refresh_from_db()
            moved = Allocation.objects.filter(pk__in=ids, released_at__isnull=True).exclude(gpu__node=node)
            own_node = sum(1 for pk, n in moved.values_list("pk", "gpu__node_id") if (before[pk], n) in others_nodes)
            evicted_after = len(pods) - _running(state, name, pods) - evicted_before
    finally:
        for patch in patches:
            patch.stop()
        server.stop()
        _delete(Cluster.objects.filter(name=name))
    return {
        "benchmark": "maintenance",
        "database": connection.vendor,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "reservations_on_fleet": len(reserved),
        "reservations_on_node": len(on_node),
        "reservations_moved": len(drain.moves),
        "own_node_moves": own_node,
        "reservation_short_s": short_s,
        "pods_on_node": len(pods),
        "evicted_before_grace": evicted_before,
        "evicted_after_grace": evicted_after,
        "grace_s": grace_s,
        "succeeded": int(drain.state == "succeeded"),
        "state": drain.state,
        "error": drain.error,
        "step_calls": calls,
        "drain_wall_s": round(wall_s, 3),
        "drain_queries": len(captured),
    }


@benchmark(
    "maintenance",
    help="Take a loaded node offline on a simulated fleet (drain-and-move): reservations moved, short, pods evicted.",
    arguments=[
        arg("--nodes", type=int, default=200),
        arg("--gpus-per-node", type=int, default=2),
        arg("--projects", type=int, default=8),
        arg("--load", type=float, default=0.5, help="Share of the other nodes' units reserved."),
        arg("--grace-s", type=int, default=600, help="Notice before the pods are evicted (simulated clock)."),
    ],
    targets=[
        correctness("succeeded", "==", 1),
        correctness("reservations_moved", "==", "reservations_on_node"),
        correctness("reservation_short_s", "==", 0),
        correctness("evicted_before_grace", "==", 0),
        correctness("evicted_after_grace", "==", "pods_on_node"),
        performance("drain_wall_s", "<=", 10),
    ],
    smoke=Smoke(("--nodes", "6", "--gpus-per-node", "2", "--projects", "3")),
)
def bench_maintenance(
    *, nodes: int, gpus_per_node: int, projects: int, load: float, grace_s: int, stdout=None, **_
) -> dict:
    return run_maintenance_bench(
        nodes=nodes, gpus_per_node=gpus_per_node, projects=projects, load=load, grace_s=grace_s
    )

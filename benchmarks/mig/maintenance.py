"""`python manage.py bench maintenance`: take a loaded node offline on a simulated fleet with drain-and-move.

Builds --nodes simulated nodes of --gpus-per-node H100-80GB, each GPU at 3g.40gb x 2, served over HTTP
(SimServer, in this process) and mirrored into the database named by DATABASE_URL. --load of every
node's units is reserved by --projects projects (active pools), the drained node (the first) fully, with
one running GPU pod per reservation on it. The drain's step bodies (and the rollout's tick) are called here,
one after the other (no broker), on a simulated clock: the notice of --grace-s is honoured without sleeping
(the evict step is called once before the deadline and once at it). Then --upgrade-nodes nodes are upgraded
by a rollout inside a maintenance window opened here (_rolling_upgrade).

Reported: reservations_moved (of reservations_on_node), reservation_short_s (reservation-seconds during
which a reservation had no unit on a node serving it: sampled after every step call, on the simulated
clock; it must be 0, which is why reservations move before any pod is evicted), evicted_after_grace and
evicted_before_grace (GPU pods gone from the node before/after the deadline), own_node_moves (moves
onto a node the project already used), the drain's wall seconds and SQL queries; for the rolling upgrade
upgrade_waves, wave_s (the longest wave, simulated), upgraded, failed_nodes_handled and upgrade_short_s.
"""

from __future__ import annotations

import time
from datetime import timedelta
from unittest import mock

from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from capacity.models import Cluster, GpuCapacity, MaintenanceWindow, MigInstance, NodeCapacity, NodeDrain
from notifications.models import Event
from operations import maintenance
from operations.maintenance import rollout, rollout_tick
from operations.models import IN_FLIGHT, DriverUpgrade
from pools.models import Allocation, GpuPool, PoolRequest
from simcluster import SimState
from simcluster.gpuoperator import DriverUpgradeController
from simcluster.kube import ClusterApi
from tenancy.models import Project

from ..capacity import delete_bench_clusters, stale_bench_clusters, unique_name
from ..registry import Smoke, arg, benchmark
from ..targets import Expr, correctness, performance
from .reconfigure import discovered_fleet  # the same fleet: H100-80GB nodes, every GPU at 3g.40gb x 2

BENCH_PREFIX = "bench-drain-"
UPGRADABLE = Expr("upgrade_nodes - failed_nodes", lambda r: r["upgrade_nodes"] - r["failed_nodes"])


def _delete(clusters) -> None:
    projects = list(
        Project.objects.filter(slug__startswith=BENCH_PREFIX, pools__cluster__in=clusters)
        .distinct()
        .values_list("pk", flat=True)
    )
    DriverUpgrade.objects.filter(cluster__in=clusters).delete()  # nodes cascade
    NodeDrain.objects.filter(cluster__in=clusters).delete()  # steps cascade
    Allocation.objects.filter(gpu__node__cluster__in=clusters).delete()
    GpuPool.objects.filter(cluster__in=clusters).delete()
    Event.objects.filter(project__in=projects).delete()
    PoolRequest.objects.filter(cluster__in=clusters).delete()
    PoolRequest.objects.filter(project__in=projects).delete()
    Project.objects.filter(pk__in=projects).delete()
    delete_bench_clusters(clusters)


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


def _rolling_upgrade(state, name, cluster, *, count, max_parallel, grace_s, window_s, tick_s) -> dict:
    """Upgrade `count` nodes (after gpu-0000) with a rollout (operations.maintenance.rollout, mode controller)
    inside a one-off maintenance window of `window_s` simulated seconds opened here: its tick plans each wave
    (at most `max_parallel`, the reserve rule) and starts the drains, which move the reservations and hand the
    nodes to the simulated upgrade controller (maxParallelUpgrades = `max_parallel`), whose upgrade-done gives
    them back. The tick, each drain's step and the controller are called in turn every `tick_s` simulated
    seconds. The first node fails validation and the second never comes back (when there are two or more):
    the rollout marks both failed, they stay in maintenance with their reservations elsewhere ("failed nodes
    handled"), and the other waves go on."""
    candidates = list(NodeCapacity.objects.filter(cluster=cluster).order_by("name")[1 : 1 + count])
    failing = {candidates[0].name} if candidates else set()
    lost = {candidates[1].name} if len(candidates) > 1 else set()
    controller = DriverUpgradeController(max_parallel=max_parallel, fail_validation=failing, never_return=lost)
    start = timezone.now()
    MaintenanceWindow.objects.create(
        cluster=cluster, name="bench", starts_at=start, ends_at=start + timedelta(seconds=window_s)
    )
    if not candidates:
        return {"upgrade_nodes": 0, "upgrade_waves": 0, "wave_s": 0.0, "upgraded": 0, "failed_nodes": 0}
    upgrade = rollout.create(
        cluster, nodes=candidates, mode="controller", max_parallel=max_parallel, grace_s=grace_s, name="bench"
    )
    clock = 0.0
    short_s = 0.0
    ids: dict[int, list[int]] = {}
    while clock < window_s:
        now = start + timedelta(seconds=clock)
        rollout_tick.tick(upgrade.pk, token="bench", now=now)
        upgrade.refresh_from_db()
        if upgrade.finished_at is not None:
            break
        rows = upgrade.nodes.filter(state__in=IN_FLIGHT).select_related("drain", "node")
        for row in rows:
            if row.node_id not in ids:
                ids[row.node_id] = list(
                    Allocation.objects.active().filter(gpu__node_id=row.node_id).values_list("pk", flat=True)
                )
            if row.drain.state not in ("succeeded", "failed"):
                maintenance.run_step(row.drain_id, row.drain.step, token="bench", now=now)
            short_s += _short(row.drain, ids[row.node_id]) * tick_s
        with state.lock:
            controller.step(state.cluster(name), clock)
        clock += tick_s
    upgrade.refresh_from_db()
    nodes = list(upgrade.nodes.select_related("node"))
    wave_s = []
    for wave in sorted({n.wave for n in nodes if n.wave}):
        rows = [n for n in nodes if n.wave == wave and n.draining_at]
        ends = [n.done_at or n.failed_at for n in rows]
        if rows and all(ends):
            wave_s.append((max(ends) - min(n.draining_at for n in rows)).total_seconds())
    failed = [n for n in nodes if n.state == "failed"]
    handled = sum(1 for n in failed if not Allocation.objects.active().filter(gpu__node_id=n.node_id).exists())
    return {
        "upgrade_nodes": count,
        "upgrade_state": upgrade.state,
        "upgrade_waves": upgrade.current_wave,
        "wave_s": round(max(wave_s), 1) if wave_s else 0.0,
        "wave_s_median": sorted(wave_s)[len(wave_s) // 2] if wave_s else 0.0,
        "upgraded": sum(1 for n in nodes if n.state == "done"),
        "failed_nodes": len(failing | lost),
        "failed_nodes_marked": len(failed),
        "failed_nodes_handled": handled,
        "upgrade_short_s": short_s,
        "upgrade_unplaced": sum(1 for n in nodes if n.state == "pending"),
        "upgrade_s": clock,
        "inside_window": int(upgrade.finished_at is not None and clock <= window_s),
        "max_parallel": max_parallel,
        "window_s": window_s,
    }


def run_maintenance_bench(
    *,
    nodes: int,
    gpus_per_node: int,
    projects: int,
    load: float,
    grace_s: int,
    upgrade_nodes: int = 0,
    max_parallel: int = 4,
    upgrade_grace_s: int = 60,
    window_s: int = 4 * 3600,
    upgrade_timeout_s: int = 1800,
) -> dict:
    _delete(stale_bench_clusters(BENCH_PREFIX))
    name = unique_name(BENCH_PREFIX, nodes)
    stubs = [
        mock.patch("operations.tasks.enqueue_drain_step"),  # the steps are called here, one after the other
        mock.patch("operations.tasks.enqueue_driver_upgrade_tick"),  # and the rollout's tick
        mock.patch("pools.tasks.reconcile_project_task.delay_on_commit"),  # the clusters' quotas: not measured
        mock.patch("scheduling.tasks.process_queue_task.delay_on_commit"),
        mock.patch("notifications.tasks.fan_out_task.delay_on_commit"),
        override_settings(DRIVER_UPGRADE_TIMEOUT_S=upgrade_timeout_s, DRIVER_UPGRADE_POLL_S=30),
    ]
    with discovered_fleet(name, nodes, gpus_per_node, stubs=stubs, delete=_delete) as (state, cluster):
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
        drain_wall_s = wall_s
        started = time.perf_counter()
        upgrade = _rolling_upgrade(
            state,
            name,
            cluster,
            count=min(upgrade_nodes, nodes - 1),
            max_parallel=max_parallel,
            grace_s=upgrade_grace_s,
            window_s=window_s,
            tick_s=30.0,
        )
        upgrade["upgrade_wall_s"] = round(time.perf_counter() - started, 3)
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
        "drain_error": drain.error,  # not "error": that key is how a benchmark says it could not run (bench smoke)
        "step_calls": calls,
        "drain_wall_s": round(drain_wall_s, 3),
        "drain_queries": len(captured),
        **upgrade,
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
        arg("--upgrade-nodes", type=int, default=20, help="Nodes upgraded in waves after the drain (0: none)."),
        arg("--max-parallel", type=int, default=4, help="maxParallelUpgrades, and the largest wave."),
        arg("--upgrade-grace-s", type=int, default=60),
        arg("--window-s", type=int, default=4 * 3600, help="The maintenance window the waves must fit in."),
        arg(
            "--upgrade-timeout-s",
            type=int,
            default=1800,
            help="DRIVER_UPGRADE_TIMEOUT_S: a node not back this long after its handover is marked failed.",
        ),
    ],
    targets=[
        correctness("succeeded", "==", 1),
        correctness("reservations_moved", "==", "reservations_on_node"),
        correctness("reservation_short_s", "==", 0),
        correctness("evicted_before_grace", "==", 0),
        correctness("evicted_after_grace", "==", "pods_on_node"),
        correctness("upgrade_short_s", "==", 0),
        correctness("failed_nodes_handled", "==", "failed_nodes"),
        correctness("failed_nodes_marked", "==", "failed_nodes"),
        correctness(
            "upgraded", "==", Expr("upgrade_nodes - failed_nodes", lambda r: r["upgrade_nodes"] - r["failed_nodes"])
        ),
        correctness("inside_window", "==", 1),
        performance("drain_wall_s", "<=", 10),
    ],
    smoke=Smoke(("--nodes", "8", "--gpus-per-node", "2", "--projects", "3", "--upgrade-nodes", "4", "--load", "0.2")),
)
def bench_maintenance(*, stdout=None, **options) -> dict:
    keys = (
        "nodes",
        "gpus_per_node",
        "projects",
        "load",
        "grace_s",
        "upgrade_nodes",
        "max_parallel",
        "upgrade_grace_s",
        "window_s",
        "upgrade_timeout_s",
    )
    return run_maintenance_bench(**{k: options[k] for k in keys})

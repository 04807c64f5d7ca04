"""`python manage.py bench dashboard`: the dashboard's reads over a synthetic fleet.

Builds (once per database; reused when present) a cluster named "bench-dashboard" of --nodes
nodes with 8 H100s each: half the nodes MIG-balanced (2 x 1g.10gb, 2g.20gb, 3g.40gb per GPU), half
whole GPUs; a third of the units held by pools, half of those running a workload. Then times the
dashboard JSON (fleet overview) and one page of the node view, and counts their queries.
Run it against your own database: it writes the fleet there.
"""

from __future__ import annotations

import time

from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from capacity.models import Cluster, GpuCapacity, MigInstance, MigProfile, NodeCapacity, WorkloadProfile
from gpuaas.dashboard.fleet import overview
from gpuaas.dashboard.nodes import node_view
from pools.models import Allocation, GpuPool, PoolRequest
from tenancy.models import Project

from .registry import Smoke, arg, benchmark
from .targets import Expr, correctness, performance

CLUSTER = "bench-dashboard"
LAYOUT = (("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4))


def _build(nodes: int, cluster_name: str = CLUSTER) -> Cluster:
    """Cluster `cluster_name` of `nodes` nodes x 8 H100s (the layout above), its pool, allocations and workloads.

    benchmarks.fleet.screens builds its fleet world with it, one call per cluster."""
    cluster = Cluster.objects.create(name=cluster_name, kubeconfig_path="/dev/null", status="ok")
    project, _ = Project.objects.get_or_create(slug="bench", defaults={"name": "Bench", "namespace": "bench"})
    request = PoolRequest.objects.create(project=project, name=cluster_name, count=1, state="active")
    pool = GpuPool.objects.create(project=project, request=request, cluster=cluster, name=cluster_name, state="active")
    profiles = {p.name: p for p in MigProfile.objects.filter(product="H100-80GB")}
    placements = {(p.profile.name, p.start): p for p in profiles["1g.10gb"].valid_placements.all()}
    for name in ("2g.20gb", "3g.40gb"):
        placements.update({(name, p.start): p for p in profiles[name].valid_placements.all()})
    node_rows = NodeCapacity.objects.bulk_create(
        NodeCapacity(
            cluster=cluster, name=f"node-{i:05d}", gpu_product="NVIDIA-H100-80GB-HBM3", gpu_count=8, ready=True
        )
        for i in range(nodes)
    )
    gpus = GpuCapacity.objects.bulk_create(
        GpuCapacity(
            node=node,
            index=g,
            uuid=f"GPU-{cluster_name}-{node.name}-{g}" if cluster_name != CLUSTER else f"GPU-bench-{node.name}-{g}",
            product="NVIDIA H100 80GB HBM3",
            catalog_product="H100-80GB",
            mig_mode_current=n % 2 == 0,
        )
        for n, node in enumerate(node_rows)
        for g in range(8)
    )
    instances = MigInstance.objects.bulk_create(
        MigInstance(
            gpu=gpu,
            profile=profiles[name],
            placement=placements[(name, start)],
            placement_start=start,
            placement_size=placements[(name, start)].size,
            uuid=f"MIG-{gpu.uuid}-{start}",
        )
        for gpu in gpus
        if gpu.mig_mode_current
        for name, start in LAYOUT
    )
    units = [(i.gpu, i) for i in instances] + [(g, None) for g in gpus if not g.mig_mode_current]
    held = units[::3]
    Allocation.objects.bulk_create(
        Allocation(
            pool=pool,
            project=project,
            kind="mig" if instance else "full",
            gpu=gpu,
            mig_instance=instance,
            resource_name="nvidia.com/gpu",
            product="H100-80GB",
            profile_name=instance.profile.name if instance else "",
        )
        for gpu, instance in held
    )
    WorkloadProfile.objects.bulk_create(
        WorkloadProfile(
            cluster=cluster,
            namespace="bench",
            pod_name=f"pod-{k}",
            pod_uid=f"uid-{cluster_name}-{k}",
            node=gpu.node,
            gpu=gpu,
            mig_instance=instance,
            resource_name="nvidia.com/gpu",
            project=project,
        )
        for k, (gpu, instance) in enumerate(held[::2])
    )
    return cluster


def _timed(fn, repeat: int) -> tuple[float, int]:
    """Median wall time in ms over `repeat` runs, and the query count of one run."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    with CaptureQueriesContext(connection) as queries:
        fn()
    return round(sorted(times)[len(times) // 2], 1), len(queries)


@benchmark(
    "dashboard",
    "Dashboard JSON and node view over a synthetic fleet of N nodes x 8 H100s",
    arguments=[arg("--nodes", type=int, default=500), arg("--repeat", type=int, default=5)],
    targets=[
        correctness("gpus", "==", Expr("8 x nodes", lambda r: 8 * r["nodes"])),
        # 1 reads the tier profile policies, 1 the rate cards, 7 the capacity plan per tier
        correctness("overview_queries", "<=", 27),
        correctness("node_view_page_queries", "<=", 20),
        performance("overview_ms_median", "<=", 1000),
        performance("node_view_page_ms_median", "<=", 100),
    ],
    smoke=Smoke(("--nodes", "2", "--repeat", "1")),
)
def run_dashboard_bench(*, stdout=None, nodes: int = 500, repeat: int = 5, **_) -> dict:
    cluster = Cluster.objects.filter(name=CLUSTER).first()
    if cluster is None:
        started = time.perf_counter()
        with transaction.atomic():
            _build(nodes)
        if stdout:
            stdout.write(f"built the fleet in {time.perf_counter() - started:.1f} s")
        cluster = Cluster.objects.get(name=CLUSTER)
    overview_ms, overview_queries = _timed(overview, repeat)
    node_ms, node_queries = _timed(lambda: node_view(cluster, 1), repeat)
    return {
        "benchmark": "dashboard",
        "database": connection.vendor,
        "nodes": cluster.nodes.count(),
        "gpus": GpuCapacity.objects.filter(node__cluster=cluster).count(),
        "mig_instances": MigInstance.objects.filter(gpu__node__cluster=cluster).count(),
        "overview_ms_median": overview_ms,
        "overview_queries": overview_queries,
        "node_view_page_ms_median": node_ms,
        "node_view_page_queries": node_queries,
        "repeat": repeat,
    }

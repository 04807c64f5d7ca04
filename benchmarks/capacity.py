"""Benchmarks of the capacity app, run with `python manage.py bench NAME`.

discovery: `python manage.py bench discovery --nodes 2000 --gpus-per-node 8` builds the simulator's
"scale" scenario in this process, serves it over HTTP (SimServer), registers it as a fresh cluster
and measures, on whatever database DATABASE_URL names:

- list_parse_s: the Kubernetes calls discovery makes (all nodes, all pods, paged) and their JSON
  parsing into the adapter's small objects, with no database at all (median of --repeat);
- nvml_read_s: reading every node's NVML through the simulator's fake NVML, one node after the
  other in this process. On real clusters each node agent reads its own GPUs, in parallel, so this
  is reported but is not part of first_sync_s;
- first_sync_s: from an empty database, discover_cluster() (Kubernetes lists, node rows, specs,
  workloads) plus the reconcile of all those node inventories (every GPU and MIG instance row):
  the whole central mirror built from nothing;
- resync_s / resync_queries: discover_cluster() again with nothing changed (median of --repeat;
  what the periodic beat task runs), and its SQL query count;
- resync_queries_200: the same count for a second, --small-nodes cluster, to show it does not grow.
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from capacity.adapters import nvml
from capacity.adapters.kubernetes import KubernetesClient
from capacity.models import (
    Cluster,
    DiscoveryRun,
    GpuCapacity,
    MigInstance,
    NodeCapacity,
    SpecAndCount,
    WorkloadProfile,
)
from capacity.services.discovery import INVENTORY_NONE, discover_cluster
from capacity.services.inventory import reconcile_inventory
from capacity.services.node_labels import is_gpu_node
from monitoring.models import Sample
from simcluster import SimServer, library_for_node, load_scenario
from simcluster.state import SimState

from .registry import Smoke, arg, benchmark
from .targets import Expr, correctness, performance

BENCH_PREFIX = "bench-discovery-"


def delete_cluster_rows(clusters) -> None:
    """Remove the mirrored rows of benchmark clusters (children first: the foreign keys protect)."""
    if isinstance(clusters, Cluster):
        clusters = Cluster.objects.filter(pk=clusters.pk)
    WorkloadProfile.objects.filter(cluster__in=clusters).delete()
    MigInstance.objects.filter(gpu__node__cluster__in=clusters).delete()
    GpuCapacity.objects.filter(node__cluster__in=clusters).delete()
    SpecAndCount.objects.filter(node__cluster__in=clusters).delete()
    NodeCapacity.objects.filter(cluster__in=clusters).delete()
    DiscoveryRun.objects.filter(cluster__in=clusters).delete()


def unique_name(prefix: str, *parts: object) -> str:
    """A cluster name no other run takes, even one started in the same second or one sized alike."""
    return "-".join([f"{prefix}{uuid.uuid4().hex[:12]}", *map(str, parts)])


# A benchmark cluster older than this was left by a run that crashed or was killed; a younger one may belong
# to a run still in progress (two runs at once, on one database) and is never touched by another run.
STALE_AFTER = timedelta(hours=2)


def stale_bench_clusters(prefix: str):
    """The clusters named with `prefix` that earlier runs left behind (created more than STALE_AFTER ago)."""
    return Cluster.objects.filter(name__startswith=prefix, created_at__lt=timezone.now() - STALE_AFTER)


def delete_bench_clusters(clusters) -> int:
    """Remove benchmark clusters with their rows (samples first: their series key has no constraint); how many."""
    Sample.objects.filter(series__gpu__node__cluster__in=clusters).delete()
    delete_cluster_rows(clusters)
    return clusters.delete()[1].get(Cluster._meta.label, 0)


def snapshot_nvml(api_url: str, node_name: str):
    """NVML_LIBRARY for the benchmark: the fake NVML reading one snapshot per node read (not per call)."""

    return library_for_node(api_url, node_name, max_age=3600.0)


def _serve(nodes: int, gpus_per_node: int, kube_dir: Path, seed: int | None = None):
    """The scale scenario served over HTTP; another `seed` gives other GPU UUIDs (they hash the node name)."""
    scenario = load_scenario("scale", nodes=nodes, gpus_per_node=gpus_per_node)
    state = scenario.build(SimState(seed=scenario.seed if seed is None else seed, mig_manager_delay=3600))
    server = SimServer(state).start()
    return server, server.write_kubeconfigs(kube_dir / str(nodes))["scale"]


def _list_parse_s(cluster) -> float:
    started = time.perf_counter()
    with KubernetesClient.for_cluster(cluster) as client:
        client.list_nodes()
        client.list_pods()
    return time.perf_counter() - started


def _gpu_nodes(cluster):
    with KubernetesClient.for_cluster(cluster) as client:
        return [node for node in client.list_nodes() if is_gpu_node(node)]


def _read_inventories(cluster, server) -> tuple[list, float]:
    """Every GPU node's NVML inventory through the fake NVML, and how long that took."""

    names = [node.name for node in _gpu_nodes(cluster)]
    with override_settings(NVML_LIBRARY="benchmarks.capacity.snapshot_nvml"):
        started = time.perf_counter()
        inventories = [nvml.node_inventory(server.cluster_url("scale"), name) for name in names]
        return inventories, time.perf_counter() - started


def _first_sync(cluster, inventories) -> dict:
    """Time discovery (Kubernetes part) and the reconcile of the pre-read inventories into an empty mirror."""

    delete_cluster_rows(cluster)
    started = time.perf_counter()
    outcome = discover_cluster(cluster.pk, inventory=INVENTORY_NONE)
    kubernetes = time.perf_counter() - started
    inventory = reconcile_inventory(cluster.pk, inventories)
    total = time.perf_counter() - started
    if outcome.run.status != "succeeded" or inventory.errors:
        raise RuntimeError(f"first sync failed: {outcome.run.error or inventory.errors}")
    return {"total": total, "kubernetes": kubernetes, "inventory": total - kubernetes, "result": inventory}


def _resync(cluster_id: int) -> tuple[float, int]:
    with CaptureQueriesContext(connection) as queries:
        started = time.perf_counter()
        outcome = discover_cluster(cluster_id, inventory=INVENTORY_NONE)
        elapsed = time.perf_counter() - started
    sync = outcome.sync
    if outcome.run.status != "succeeded" or sync.nodes_created or sync.nodes_updated or sync.specs_written:
        raise RuntimeError(f"the resync changed something: {outcome.run.error or sync}")
    return elapsed, len(queries)


@benchmark(
    "discovery",
    help="Discovery of the simulator's scale scenario: first sync, no-change resync, list+parse alone.",
    arguments=[
        arg("--nodes", type=int, default=2000),
        arg("--gpus-per-node", type=int, default=8),
        arg("--small-nodes", type=int, default=200, help="node count of the second cluster (query count check)"),
        arg("--repeat", type=int, default=3, help="runs of list+parse and of the resync; medians are reported"),
        arg("--first-repeat", type=int, default=3, help="first syncs from an empty mirror; the median is reported"),
    ],
    targets=[
        correctness("gpus", "==", Expr("nodes x gpus_per_node", lambda r: r["nodes"] * r["gpus_per_node"])),
        correctness("gpus_written", "==", "gpus"),
        correctness("mig_written", "==", "mig_instances"),
        performance("first_sync_s", "<=", 5),
        performance("ratio_resync", "<=", 2),
        # A cost that must not grow with the fleet; one run differed by a query between two equal clusters.
        performance("resync_queries", "==", "resync_queries_200"),
    ],
    smoke=Smoke(("--nodes", "20", "--small-nodes", "10", "--repeat", "1", "--first-repeat", "1")),
)
def run_discovery_bench(
    *, stdout, nodes: int, gpus_per_node: int, small_nodes: int, repeat: int, first_repeat: int
) -> dict:
    removed = delete_bench_clusters(stale_bench_clusters(BENCH_PREFIX))
    big = small = None
    with tempfile.TemporaryDirectory() as tmp:
        stdout.write(
            f"building the scale scenario: {nodes} + {small_nodes} nodes ({removed} stale bench clusters removed)"
        )
        big_server, big_config = _serve(nodes, gpus_per_node, Path(tmp))
        # Its own seed: at sizes whose node names coincide, the two clusters would share GPU UUIDs.
        small_server, small_config = _serve(small_nodes, gpus_per_node, Path(tmp), seed=8)
        # The simulated clusters live in this process (millions of objects): keep the cyclic garbage
        # collector from rescanning them on every collection, which would bill their cost to discovery.
        gc.collect()
        gc.freeze()
        try:
            big = Cluster.objects.create(name=unique_name(BENCH_PREFIX, "big", nodes), kubeconfig_path=str(big_config))
            small = Cluster.objects.create(
                name=unique_name(BENCH_PREFIX, "small", small_nodes), kubeconfig_path=str(small_config)
            )
            list_parse = statistics.median(_list_parse_s(big) for _ in range(max(1, repeat)))
            inventories, nvml_read = _read_inventories(big, big_server)
            firsts = [_first_sync(big, inventories) for _ in range(max(1, first_repeat))]
            first = sorted(firsts, key=lambda f: f["total"])[len(firsts) // 2]
            resyncs = [_resync(big.pk) for _ in range(max(1, repeat))]
            _first_sync(small, _read_inventories(small, small_server)[0])
            small_queries = _resync(small.pk)[1]
            resync_s = statistics.median(t for t, _ in resyncs)
            inventory = first["result"]
            load = os.getloadavg()[0]
            result = {
                "nodes": NodeCapacity.objects.filter(cluster=big).count(),
                "gpus_per_node": gpus_per_node,
                "gpus": GpuCapacity.objects.filter(node__cluster=big).count(),
                "mig_instances": MigInstance.objects.filter(gpu__node__cluster=big).count(),
                "database": connection.vendor,
                "first_sync_s": round(first["total"], 3),
                "first_sync_kubernetes_s": round(first["kubernetes"], 3),
                "first_sync_inventory_s": round(first["inventory"], 3),
                "first_sync_runs_s": [round(f["total"], 3) for f in firsts],
                "first_sync_includes": "k8s lists, node/spec/workload rows, reconcile of every node's NVML inventory",
                "nvml_read_s": round(nvml_read, 3),
                "gpus_written": inventory.gpus_written,
                "mig_written": inventory.mig_written,
                "resync_s": round(resync_s, 3),
                "resync_queries": resyncs[-1][1],
                "list_parse_s": round(list_parse, 3),
                "ratio_resync": round(resync_s / list_parse, 2),
                "ratio_first": round(first["total"] / list_parse, 2),
                "resync_queries_200": small_queries,
                "small_nodes": small_nodes,
                "load_average_1m": round(load, 2),
                "cpus": os.cpu_count(),
            }
        finally:
            gc.unfreeze()
            big_server.stop()
            small_server.stop()
            delete_bench_clusters(Cluster.objects.filter(pk__in=[c.pk for c in (big, small) if c is not None]))
    return result

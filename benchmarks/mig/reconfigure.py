"""`python manage.py bench mig-reconfigure`: the whole reconfiguration workflow on a simulated cluster.

Builds --nodes simulated nodes of --gpus-per-node H100-80GB, each GPU at 3g.40gb x 2, serves them
over HTTP (SimServer, in this process), mirrors them into the database named by DATABASE_URL and
reconfigures every node to all-balanced through --backend, calling each step's task body directly
(no broker), on the operator path with the simulated MIG manager run as soon as apply waits and the
inventory reads that apply and verify ask the node agent for done here (the agent's read, the ingest); on
the agent path the node agent's MIG command is carried out here and its result recorded.

Reported: the gpuaas side of a reconfiguration, i.e. wall seconds and SQL queries per node for the
seven steps (Kubernetes calls to the in-process simulator and, on the agent path, the fake NVML
included; the GPU Operator's own reconfiguration time is not, it is simulated as instant), and the
time to rebuild the mig-parted document with every node's config in it.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock

from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings

from capacity.adapters import kubernetes as kube
from capacity.agent import node as agent
from capacity.mig.catalog import PRODUCTS
from capacity.models import Cluster, MigReconfiguration, NodeCapacity
from capacity.services import mig_configs
from capacity.services.discovery import discover_cluster
from capacity.services.inventory import ingest_inventory_reports
from operations import reconfiguration as rc
from operations.reconfiguration.commands import record_result
from simcluster import SimServer, SimState, gpuoperator

from ..capacity import delete_bench_clusters, stale_bench_clusters, unique_name
from ..registry import Smoke, arg, benchmark
from ..targets import correctness

BENCH_PREFIX = "bench-reconfig-"


def _delete_bench_clusters(clusters) -> None:
    MigReconfiguration.objects.filter(cluster__in=clusters).delete()  # steps cascade
    delete_bench_clusters(clusters)


def _build(name: str, nodes: int, gpus_per_node: int):
    state = SimState(seed=11, mig_manager_delay=3600)
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


@contextmanager
def discovered_fleet(name: str, nodes: int, gpus_per_node: int, *, stubs, delete):
    """_build's fleet, served by a SimServer and discovered inline as Cluster `name`, with `stubs` (mock.patch,
    override_settings) in force; yields (state, cluster). On the way out the stubs end, the server stops and
    `delete(clusters)` removes what the benchmark wrote."""
    with ExitStack() as stack:
        stack.callback(lambda: delete(Cluster.objects.filter(name=name)))
        server = SimServer(state := _build(name, nodes, gpus_per_node)).start()
        stack.callback(server.stop)
        for stub in stubs:
            stack.enter_context(stub)
        path = server.write_kubeconfigs(Path(stack.enter_context(tempfile.TemporaryDirectory())))[name]
        cluster = Cluster.objects.create(name=name, kubeconfig_path=str(path))
        outcome = discover_cluster(cluster.pk, inventory="inline")
        if outcome.run.status != "succeeded":
            raise RuntimeError(f"discovery failed: {outcome.run.error}")
        yield state, cluster


def run_mig_reconfigure_bench(*, nodes: int, gpus_per_node: int, backend: str) -> dict:
    _delete_bench_clusters(stale_bench_clusters(BENCH_PREFIX))
    name = unique_name(BENCH_PREFIX, nodes, backend)
    # The steps are called here, one after the other: nothing goes to the broker.
    stubs = [
        mock.patch("operations.tasks.enqueue_reconfiguration_step"),
        # Nor the node agents' work (inventory requests, MIG commands): it is done below, in this process.
        mock.patch("operations.reconfiguration.commands.enqueue_inventory"),
        mock.patch("operations.reconfiguration.commands._send"),
        # The simulated MIG manager's mounted ConfigMap is refreshed at once: no kubelet delay to wait out.
        override_settings(MIG_PARTED_SYNC_S=0),
    ]
    with discovered_fleet(name, nodes, gpus_per_node, stubs=stubs, delete=_delete_bench_clusters) as (state, cluster):
        api_url = kube.api_url_for(cluster)
        seconds, queries, steps, failed = [], [], [], []
        for node in NodeCapacity.objects.filter(cluster=cluster).order_by("name"):
            source, target = rc.target_from(node, named="all-balanced")
            started = time.perf_counter()
            with CaptureQueriesContext(connection) as captured:
                reconf = rc.create(node, target, source=source, backend=backend, force=True)
                calls = 0
                while reconf.state not in ("succeeded", "failed") and calls < 30:
                    outcome = rc.run_step(reconf.pk, reconf.step, token="bench")
                    calls += 1
                    if outcome == "waiting" and reconf.step == "apply" and backend == "agent":
                        reconf.refresh_from_db()  # the agent carries out the command, its result is recorded
                        record_result(agent.apply_mig(reconf.agent_command, api_url=api_url))
                    elif outcome == "waiting" and reconf.step == "apply":
                        state.run_mig_manager(name)
                    if backend == "operator" and (reconf.step, outcome) in (
                        ("apply", "advanced"),
                        ("verify", "waiting"),
                    ):  # the inventory apply and verify ask for: the agent's read, the ingest's write
                        ingest_inventory_reports([agent.read_inventory(name, node.name, api_url=api_url)])
                    reconf.refresh_from_db()
            seconds.append(time.perf_counter() - started)
            queries.append(len(captured))
            steps.append(calls)
            if reconf.state != "succeeded":
                failed.append(f"{node.name}: {reconf.error}")
        started = time.perf_counter()
        document = mig_configs.mig_parted_document(cluster)
        document_s = time.perf_counter() - started
    return {
        "benchmark": "mig-reconfigure",
        "database": connection.vendor,
        "backend": backend,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "succeeded": nodes - len(failed),
        "failed": failed[:5],
        "step_calls_per_node": statistics.median(steps),
        "per_node_s_median": round(statistics.median(seconds), 4),
        "per_node_s_max": round(max(seconds), 4),
        "total_s": round(sum(seconds), 3),
        "queries_per_node_median": statistics.median(queries),
        "queries_per_node_max": max(queries),
        "mig_parted_configs": len(document["mig-configs"]),
        "mig_parted_document_s": round(document_s, 4),
    }


@benchmark(
    "mig-reconfigure",
    help="Reconfigure N simulated nodes to all-balanced through every workflow step; seconds and queries per node.",
    arguments=[
        arg("--nodes", type=int, default=20),
        arg("--gpus-per-node", type=int, default=8),
        arg("--backend", choices=["operator", "agent"], default="operator"),
    ],
    targets=[correctness("succeeded", "==", "nodes")],
    smoke=Smoke(("--nodes", "2", "--gpus-per-node", "2", "--backend", "agent")),
)
def bench_mig_reconfigure(*, nodes: int, gpus_per_node: int, backend: str, stdout=None, **_) -> dict:
    return run_mig_reconfigure_bench(nodes=nodes, gpus_per_node=gpus_per_node, backend=backend)

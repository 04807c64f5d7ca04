"""The demo's world: logins, the simulated clusters registered and discovered, and a lifecycle to look at.

Every screen has something to show: requests waiting for approval, active pools in several tiers, a
MIG layout ready to apply, health events (faults injected into the simulator), idle reservations and a
past month of billing. History older than the demo itself (last month's allocations, 24 h of idle
samples) is backdated seed data and says so in docs/demo.md; everything after start-up is collected
live from the simulator by the worker and beat.

Idempotent: each step looks for what it would create, so `make demo` can run again on the same var/.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from billing.services import close_month, meter_usage, previous_period, seed_default_card
from capacity.adapters.kubernetes import KubernetesClient
from capacity.models import Cluster, GpuCapacity, MigInstance, MigLayout, NodeCapacity
from capacity.services.clusters import register_cluster
from capacity.services.discovery import INVENTORY_INLINE, discover_cluster
from core.celery import node_queue
from monitoring.models import HealthEvent, Sample
from monitoring.services.collect import UnitSample, poll_slot, write_samples
from monitoring.services.idle import detect_idle
from monitoring.services.ingest import ingest_samples, sample_row, series_ids
from monitoring.services.reports import poll_node
from monitoring.services.rollups import run_rollups
from pools import services as pool_services
from pools.choices import Isolation, RequestState, WorkloadType
from pools.models import Allocation, GpuPool, PoolRequest
from pools.provisioning import provision_pool
from tenancy.models import IdentityGroupRole, Project
from tenancy.roles import operators_group, set_role

OPERATOR = ("operator", os.environ.get("GPUAAS_DEMO_OPERATOR_PASSWORD", "operator-demo-pw"))
MEMBER = ("member", os.environ.get("GPUAAS_DEMO_MEMBER_PASSWORD", "member-demo-pw"))

PROJECTS = [
    # slug, name, namespace, cost centre
    ("vision", "Computer Vision", "team-vision", "CC-1001"),
    ("nlp", "Language Models", "team-nlp", "CC-1002"),
    ("research", "Research Lab", "team-research", "CC-2001"),
]

# name, project, cluster, declared needs, approve?, backdate days
REQUESTS = [
    (
        "vision-inference",
        "vision",
        "prod",
        dict(
            isolation=Isolation.MIG, workload_type=WorkloadType.INFERENCE, product="H100-80GB", profile_name="3g.40gb"
        ),
        2,
        True,
        40,
    ),
    (
        "vision-batch",
        "vision",
        "prod",
        dict(
            isolation=Isolation.MIG,
            workload_type=WorkloadType.INFERENCE,
            product="H100-80GB",
            profile_name="1g.10gb",
            tier="2",
        ),
        4,
        True,
        3,
    ),
    (
        "nlp-training",
        "nlp",
        "prod",
        dict(isolation=Isolation.FULL, workload_type=WorkloadType.TRAINING, product="H100-80GB"),
        4,
        True,
        40,
    ),
    (
        "research-notebooks",
        "research",
        "dev",
        dict(isolation=Isolation.TIMESLICE, workload_type=WorkloadType.DEVELOPMENT, product="H200-141GB"),
        6,
        True,
        2,
    ),
    (
        "vision-staging",
        "vision",
        "prod",
        dict(isolation=Isolation.MIG, workload_type=WorkloadType.STAGING, product="H100-80GB", profile_name="4g.40gb"),
        1,
        False,
        0,
    ),
    (
        "research-finetune",
        "research",
        "prod",
        dict(isolation=Isolation.MIG, workload_type=WorkloadType.INFERENCE, memory_gib=30),
        2,
        False,
        0,
    ),
]


# The teams' workloads, started by seeding once their pools are provisioned: pool name -> (pod name, resource,
# count, workload type). The scenario's own pods (simcluster/scenarios/demo.yaml) ran before gpuaas knew the
# teams; seeding stops them and starts these with their pool's scheduling (GpuPool.scheduling()), so every pod
# runs on its own pool's units. vision-batch keeps 3 of its 4 units and vision-inference 1 of its 2 without a
# pod: those are the idle reservations docs/demo.md announces.
POOL_PODS = {
    "vision-inference": [("tracker", "nvidia.com/mig-3g.40gb", 1, WorkloadType.INFERENCE)],
    "vision-batch": [("detector", "nvidia.com/mig-1g.10gb", 1, WorkloadType.INFERENCE)],
    "nlp-training": [
        ("llm-train-0", "nvidia.com/gpu", 2, WorkloadType.TRAINING),
        ("llm-train-1", "nvidia.com/gpu", 2, WorkloadType.TRAINING),
    ],
    "research-notebooks": [
        ("notebook-0", "nvidia.com/gpu", 1, WorkloadType.DEVELOPMENT),
        ("notebook-1", "nvidia.com/gpu", 1, WorkloadType.DEVELOPMENT),
    ],
}
POD_WAIT_S = 60


def _users():
    User = get_user_model()
    operator = User.objects.filter(username=OPERATOR[0]).first()
    if operator is None:
        operator = User.objects.create_superuser(OPERATOR[0], "operator@example.com", OPERATOR[1])
    member = User.objects.filter(username=MEMBER[0]).first()
    if member is None:
        member = User.objects.create_user(MEMBER[0], "member@example.com", MEMBER[1])
    operators_group()  # so that a real operator is made by adding a staff user to it
    return operator, member


def _clusters(kube_dir: Path, stdout) -> dict[str, Cluster]:
    clusters = {}
    for path in sorted(kube_dir.glob("*.kubeconfig")):
        cluster, _ = register_cluster(path.stem, path)
        run = discover_cluster(cluster.pk, inventory=INVENTORY_INLINE).run
        stdout.write(f"    {cluster.name}: discovery {run.status}, {run.nodes_seen} nodes, {run.gpus_seen} GPUs")
        clusters[cluster.name] = cluster
    return clusters


def _projects(member) -> dict[str, Project]:
    projects = {}
    for slug, name, namespace, cost_centre in PROJECTS:
        project, _ = Project.objects.get_or_create(
            slug=slug, defaults={"name": name, "namespace": namespace, "cost_centre": cost_centre}
        )
        projects[slug] = project
    set_role(projects["vision"], member, "member")
    # Company sign-in (simcluster/oidc.py's people): its operators' group, and the vision team's.
    IdentityGroupRole.objects.get_or_create(group="gpuaas-operators", operator=True)
    IdentityGroupRole.objects.get_or_create(
        group="team-vision", project=projects["vision"], defaults={"role": "member"}
    )
    return projects


def _rediscover(clusters: dict[str, Cluster]) -> None:
    for cluster in clusters.values():
        discover_cluster(cluster.pk, inventory=INVENTORY_INLINE)


def _wait_for_pods(client: KubernetesClient, namespace: str, *, gone: set[str] = frozenset(), running=()) -> None:
    """Wait until the pods in `gone` have left and those in `running` run (the simulator's --unkind timings)."""
    deadline = time.monotonic() + POD_WAIT_S
    while True:
        pods = {pod.name: pod for pod in client.list_pods(namespace)}
        if not gone & pods.keys() and all(name in pods and pods[name].phase == "Running" for name in running):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"pods in {namespace} did not settle in {POD_WAIT_S} s")
        time.sleep(0.5)


def _stop_scenario_pods(projects, clusters) -> None:
    """Stop the teams' pods that ran before gpuaas knew them (once: before the first request is seeded)."""
    if PoolRequest.objects.filter(project__in=projects.values()).exists():
        return
    namespaces = [project.namespace for project in projects.values()]
    for cluster in clusters.values():
        with KubernetesClient.for_cluster(cluster) as client:
            for namespace in namespaces:
                names = {pod.name for pod in client.list_pods(namespace)}
                for name in sorted(names):
                    client.delete_pod(namespace, name)
                _wait_for_pods(client, namespace, gone=names)
    _rediscover(clusters)


def _start_pool_pods(projects, clusters) -> None:
    """Start each seeded pool's pods with the pool's scheduling, so the device plugin gives them the pool's units."""
    started = False
    for pool in GpuPool.objects.filter(project__in=projects.values(), name__in=POOL_PODS).select_related(
        "project", "cluster"
    ):
        with KubernetesClient.for_cluster(pool.cluster) as client:
            existing = {pod.name for pod in client.list_pods(pool.project.namespace)}
            wanted = [spec for spec in POOL_PODS[pool.name] if spec[0] not in existing]
            for name, resource, count, workload_type in wanted:
                body = {
                    "metadata": {
                        "name": name,
                        "namespace": pool.project.namespace,
                        "labels": {"app": name.rsplit("-", 1)[0], "gpuaas.io/workload-type": workload_type},
                    },
                    "spec": {
                        "containers": [
                            {"name": "main", "image": "demo/worker:1", "resources": {"limits": {resource: str(count)}}}
                        ],
                        **pool.scheduling(),
                    },
                }
                client.create_pod(pool.project.namespace, body)
            _wait_for_pods(client, pool.project.namespace, running=[spec[0] for spec in wanted])
            started = started or bool(wanted)
    if started:
        _rediscover(clusters)


def _requests(operator, projects, clusters, stdout) -> None:
    now = timezone.now()
    for name, slug, cluster_name, declared, count, approve, backdate_days in REQUESTS:
        project = projects[slug]
        if PoolRequest.objects.filter(project=project, name=name).exists():
            continue
        spec = pool_services.resolve_spec(**declared)
        values = dict(
            name=name,
            isolation=spec.isolation,
            tier=spec.tier,
            spec_kind=spec.spec_kind,
            product=spec.product,
            profile_name=spec.profile_name,
            count=count,
            workload_type=declared["workload_type"],
            memory_gib=declared.get("memory_gib"),
            justification=f"Demo: {name}",
            cluster=clusters.get(cluster_name),
            tags=[spec.profile_name or spec.spec_kind],
        )
        request = pool_services.create_request(project, actor=operator, submit=True, **values)
        if not approve:
            stdout.write(f"    request {name}: waiting for approval")
            continue
        try:
            pool = pool_services.approve(request, actor=operator, reason="Demo approval")
        except Exception as exc:  # shortage is shown to the operator, not a demo failure
            stdout.write(f"    request {name}: not approved ({exc})")
            continue
        if backdate_days:
            _backdate(request, pool, now - timedelta(days=backdate_days))
        provision_pool(pool)
        stdout.write(f"    request {name}: approved, pool {pool.name} provisioned")


@transaction.atomic
def _backdate(request: PoolRequest, pool: GpuPool, at) -> None:
    """Seed history: this pool was approved `at`, so billing has a past month to show."""
    PoolRequest.objects.filter(pk=request.pk).update(approved_at=at, start_at=at)
    request.transitions.update(at=at)
    GpuPool.objects.filter(pk=pool.pk).update(created_at=at)
    Allocation.objects.filter(pool=pool).update(allocated_at=at)


def _layout() -> None:
    MigLayout.objects.get_or_create(
        name="inference-heavy",
        defaults={
            "product": "H100-80GB",
            "gpus": {"all": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]},
            "description": "Demo: more small inference slots; apply it to a tier-2 node from the node's admin page.",
        },
    )


def _sim_fault(cluster: Cluster, payload: dict) -> None:
    """Arm a hardware fault in the simulator over its control endpoint (a demo-only backdoor)."""
    url = cluster.api_endpoint.rstrip("/") + "/sim/v1/faults"
    body = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=5).read()


def _health(clusters) -> None:
    prod = clusters.get("prod")
    if prod is None or HealthEvent.objects.exists():
        return
    nodes = list(NodeCapacity.objects.for_cluster(prod).present().order_by("name"))
    if len(nodes) < 2:
        return
    _sim_fault(prod, {"fault": "ecc_double_bit", "node": nodes[-1].name, "gpu": 7, "count": 2})
    _sim_fault(prod, {"fault": "thermal_throttle", "node": nodes[0].name, "gpu": 5})
    for node in (nodes[0], nodes[-1]):
        poll_node(node.pk)


HISTORY_S = (24 * 60 + 30) * 60


def _sim_history(cluster: Cluster, node: str, seconds: int, step: int) -> dict:
    """The simulator's activity of a node's units over the past `seconds` (a demo-only backdoor)."""
    query = urllib.parse.urlencode({"seconds": seconds, "step": step})
    url = f"{cluster.api_endpoint.rstrip('/')}/sim/v1/nodes/{urllib.parse.quote(node)}/history?{query}"
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


RECENT_S = 2 * 3600  # every unit at the poll interval over the last two hours (raw charts); older: one per 5 minutes
THIN_S = 300
HISTORY_BATCH = 20_000
HISTORY_COLUMNS = ("sm_active", "mem_used_mib", "power_w", "temp_c", "gpu_util")


def _history(clusters: dict[str, Cluster]) -> None:
    """Backdated samples for every unit of every node, from the simulator's own activity model.

    The simulator computes each unit's past readings with the model that ticks (the same per-unit
    levels, in the same units: SM percent, MiB, watts, degrees), given the work placed on it now, so
    a chart over the last day (a GPU's, a pool's, a cluster's total) runs into the first live poll
    without a step. Held units get every poll of the day (idle detection reads them); the others
    every poll of the last two hours and one sample per 5-minute bucket before that. Units held with
    nothing running on them read idle, so the idle report has cases.
    """
    step = settings.METRICS_INTERVAL_S
    last = poll_slot()
    if Sample.objects.filter(ts__lt=last - timedelta(seconds=RECENT_S)).exists():
        return
    held = Allocation.objects.active()
    held_units = set(held.values_list("gpu__uuid", "mig_instance__uuid"))
    points = HISTORY_S // step
    recent = RECENT_S // step
    for cluster in clusters.values():
        gpus = {gpu.uuid: gpu.pk for gpu in GpuCapacity.objects.present().filter(node__cluster=cluster)}
        migs = dict(MigInstance.objects.active().filter(gpu__node__cluster=cluster).values_list("uuid", "pk"))
        by_ts: dict[int, list[UnitSample]] = {}
        for node in NodeCapacity.objects.for_cluster(cluster).present().order_by("name"):
            for unit in _sim_history(cluster, node.name, HISTORY_S, step)["units"]:
                gpu_id = gpus.get(unit["gpu"])
                mig_id = migs.get(unit["uuid"]) if unit["mig"] else None
                if gpu_id is None or (unit["mig"] and mig_id is None):
                    continue
                key = (unit["gpu"], unit["uuid"]) if unit["mig"] else (unit["gpu"], None)
                every = key in held_units
                for k in range(points):
                    ts_epoch = int((last - timedelta(seconds=(points - k) * step)).timestamp())
                    if not (every or k >= points - recent or ts_epoch % THIN_S == 0):
                        continue
                    values = {c: unit[c][k] for c in HISTORY_COLUMNS if c in unit and unit[c][k] is not None}
                    by_ts.setdefault(ts_epoch, []).append(UnitSample(gpu_id, mig_id, values))
        if not by_ts:
            continue
        # The newest slot through the poll's own path (series, their source); the rest as rows in large batches:
        # a day of every unit is some 10^5 rows, one write per slot took minutes.
        newest = max(by_ts)
        write_samples(by_ts.pop(newest), ts=datetime.fromtimestamp(newest, tz=UTC), source="nvml")
        series = series_ids({(u.gpu_id, u.mig_instance_id) for samples in by_ts.values() for u in samples})
        rows = [
            sample_row(series[(u.gpu_id, u.mig_instance_id)], datetime.fromtimestamp(ts_epoch, tz=UTC), u.values)
            for ts_epoch in sorted(by_ts)
            for u in by_ts[ts_epoch]
        ]
        for i in range(0, len(rows), HISTORY_BATCH):
            ingest_samples(rows[i : i + HISTORY_BATCH])
    run_rollups()
    detect_idle()


def _billing() -> None:
    seed_default_card()
    meter_usage()
    close_month(previous_period())


def node_queues() -> list[str]:
    """Every present node's queue: under the simulator one worker serves them all."""
    nodes = NodeCapacity.objects.present().select_related("cluster")
    return [node_queue(node.cluster.name, node.name) for node in nodes]


def seed(*, kube_dir: Path, stdout) -> dict[str, str]:
    """Build the demo world; returns the logins to print."""
    operator, member = _users()
    clusters = _clusters(kube_dir, stdout)
    projects = _projects(member)
    _stop_scenario_pods(projects, clusters)
    _requests(operator, projects, clusters, stdout)
    _start_pool_pods(projects, clusters)
    _layout()
    stdout.write("    monitoring: health faults injected, a day of history from the simulator's model, rollups")
    _health(clusters)
    _history(clusters)
    stdout.write("    billing: metering from approval, last month's statements")
    _billing()
    unhealthy = GpuCapacity.objects.filter(health="unhealthy").count()
    stdout.write(
        f"    {unhealthy} GPU(s) unhealthy, {PoolRequest.objects.filter(state=RequestState.SUBMITTED).count()}"
        " request(s) waiting for approval"
    )
    return {"operator": f"{OPERATOR[0]} / {OPERATOR[1]}", "member": f"{MEMBER[0]} / {MEMBER[1]}"}

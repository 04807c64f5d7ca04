"""Control-plane work at fleet scale (#28): discovery, an approval, a queue pass and its forecasts.

`measure(scale)` runs against whatever fleet world is in the configured database (`bench fleet` builds
10 clusters, 12,500 nodes, 100,000 GPUs, 10,000 projects, 200,000 allocations); build_world() makes a
smaller stand-in of the same shape for this module's own runs and tests. Every figure comes with its
floor (the least work the path must do), their ratio, and `<figure>_met` against the target in TARGETS.
What measure() creates (waiting requests, an operator, simulated clusters) it removes before it returns;
approvals and queue passes run inside a transaction that is rolled back, so the world is left unchanged.

- discovery: the database's clusters have no Kubernetes behind them, so measure() builds its own: 10
  clusters of the simulator's "scale" scenario, 1,250 x scale nodes of 8 GPUs each (the fleet's 12,500
  nodes), served one at a time (a cluster's objects in this process, not the fleet's). Per cluster, as
  `bench discovery` does: list+parse of the same Kubernetes responses (the floor), the first sync into
  an empty mirror (Kubernetes part and the reconcile of every node's NVML inventory), and a no-change
  resync. Figures are summed over the 10 clusters (the beat discovers clusters one by one).
- approval: services.approve() of a one-unit request for the spec with the most free units in the
  world (approval_free_units says how many); floor: the candidate lock query alone (SELECT ... FOR
  UPDATE SKIP LOCKED of one free unit of that spec). Median of APPROVAL_REPEAT, each rolled back.
- queue: QUEUE_WAITING x scale queued requests (a mix of specs, most blocked, over the world's
  projects) and one queue.process() pass; floor: locking the queued rows and reading the entries with
  their requests (what any pass must read). Rolled back.
- forecast: forecast.estimate_start() of FORECAST_SAMPLES of those requests spread over the queue (the
  worst is forecast_ms); floor: units.read_free() of the same request (its free units, read once).
"""

from __future__ import annotations

import datetime as dt
import gc
import os
import statistics
import tempfile
import uuid
from pathlib import Path
from unittest import mock

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Count, OuterRef, Subquery
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from capacity.choices import SpecKind, Tier
from capacity.models import Cluster, GpuCapacity, MigInstance, NodeCapacity
from pools import services, units
from pools.choices import PriorityClass, RequestState
from pools.models import Allocation, GpuPool, PoolRequest
from pools.models.queue import QueueEntry
from pools.units import take
from scheduling import forecast, queue
from tenancy.models import Project

from .. import capacity as discovery_bench
from ..pools import approval_spec, units_per_gpu
from .timing import in_ms, rolled_back, timed, with_floor

CLUSTERS = 10
NODES_PER_CLUSTER = 1250
GPUS_PER_NODE = 8
QUEUE_WAITING = 10_000
QUEUE_BUILT_OVER_H = 168  # the waiting requests arrived over a week (the forecast reads their rate)
FORECAST_SAMPLES = 10
APPROVAL_REPEAT = 5
BATCH = 5000
WORLD_PREFIX = "fleetctl-"  # build_world's clusters
MARK = "bench-fleet-control"  # justification of the requests measure() creates, so it removes exactly those

# figure: (what the target bounds, its limit). Discovery: the no-change resync within 2x its list+parse floor
# (`bench discovery`'s target); the first sync of each 1,250-node cluster within 5 s (`bench discovery`'s
# target for 2,000 nodes), which is about 5x list+parse here: its ratio is reported, bounded by the seconds.
TARGETS: dict[str, tuple[str, float]] = {
    "discovery_first_sync_s": ("discovery_first_sync_per_cluster_s", 5.0),
    "discovery_resync_s": ("discovery_resync_s_ratio", 2.0),
    "approval_ms": ("approval_ms", 100.0),
    "queue_pass_s": ("queue_pass_s", 5.0),
    "forecast_ms": ("forecast_ms", 200.0),
}


# --- A world of the fleet's shape --------------------------------------------------------------------


def build_world(scale: float = 1.0) -> dict:
    """10 clusters of 1,250 x scale nodes of 8 GPUs (H100 and H200): 30% of nodes MIG (H100, as many instances
    of approval_spec()'s profile per GPU as fit), 6% time-sliced (4 replicas), the rest whole GPUs; 10,000 x
    scale projects; allocations holding about 53% of MIG instances, 96% of whole GPUs and every replica, four
    units per pool (200,000 allocations at scale 1). Bulk inserts; returns the row counts."""
    tier, profile = approval_spec()
    placements = units_per_gpu(profile)
    nodes_per_cluster = max(4, round(NODES_PER_CLUSTER * scale))
    projects = Project.objects.bulk_create(
        [
            Project(name=f"Fleet {i}", slug=f"fleet{i:05d}", namespace=f"fleet{i:05d}")
            for i in range(max(10, round(10_000 * scale)))
        ],
        BATCH,
    )
    user = get_user_model().objects.create_user(f"{WORLD_PREFIX}requester")
    nodes, kinds = [], []
    for c in range(CLUSTERS):
        cluster = Cluster.objects.create(name=f"{WORLD_PREFIX}{c}", kubeconfig_path="/dev/null")
        for i in range(nodes_per_cluster):
            share = i / nodes_per_cluster
            kind = SpecKind.MIG if share < 0.3 else SpecKind.TIMESLICE if share < 0.36 else SpecKind.FULL
            product = "H100-80GB" if kind != SpecKind.FULL or i % 2 else "H200-141GB"
            fields = {"tier": Tier.TRAINING if kind == SpecKind.FULL else Tier.DEVELOPMENT}
            if kind == SpecKind.MIG:
                fields = {"tier": tier, "mig_strategy": "mixed"}
            elif kind == SpecKind.TIMESLICE:
                fields["timeslice_replicas"] = 4
            nodes.append(
                NodeCapacity(
                    cluster=cluster,
                    name=f"c{c}-n{i:05d}",
                    ready=True,
                    gpu_count=GPUS_PER_NODE,
                    gpu_product=product,
                    **fields,
                )
            )
            kinds.append((kind, product))
    nodes = NodeCapacity.objects.bulk_create(nodes, BATCH)
    gpus = GpuCapacity.objects.bulk_create(
        [
            GpuCapacity(
                node=node,
                index=g,
                uuid=f"GPU-{node.pk}-{g}",
                product=f"NVIDIA {product.split('-')[0]}",
                catalog_product=product,
                mig_mode_current=kind == SpecKind.MIG,
            )
            for node, (kind, product) in zip(nodes, kinds, strict=True)
            for g in range(GPUS_PER_NODE)
        ],
        BATCH,
    )
    kind_of = {g.pk: kinds[i // GPUS_PER_NODE][0] for i, g in enumerate(gpus)}
    mig_gpus = [g for g in gpus if kind_of[g.pk] == SpecKind.MIG]
    instances = MigInstance.objects.bulk_create(
        [
            MigInstance(
                gpu=g,
                profile=profile,
                placement=p,
                placement_start=p.start,
                placement_size=p.size,
                uuid=f"MIG-{g.pk}-{p.start}",
            )
            for g in mig_gpus
            for p in placements
        ],
        BATCH,
    )
    # The units held: (kind, gpu, instance, replica, product, profile, slices, resource)
    held: list[tuple] = []
    for n, inst in enumerate(instances):
        if n % 21 < 11:
            held.append((SpecKind.MIG, inst.gpu_id, inst.pk, 0, "H100-80GB", profile.name, profile.compute_slices))
    for n, g in enumerate(gpus):
        kind = kind_of[g.pk]
        if kind == SpecKind.FULL and n % 25:
            held.append((SpecKind.FULL, g.pk, None, 0, g.catalog_product, "", 7))
        elif kind == SpecKind.TIMESLICE:
            held += [(SpecKind.TIMESLICE, g.pk, None, r, g.catalog_product, "", 2) for r in range(4)]
    groups = [held[i : i + 4] for i in range(0, len(held), 4)]
    cluster_of = {n.pk: n.cluster_id for n in nodes}
    node_of = {g.pk: g.node_id for g in gpus}
    now = timezone.now()
    requests = PoolRequest.objects.bulk_create(
        [
            PoolRequest(
                project=projects[i % len(projects)],
                requested_by=user,
                spec_kind=group[0][0],
                isolation=group[0][0],
                product=group[0][4],
                profile_name=group[0][5],
                tier=tier if group[0][0] == SpecKind.MIG else Tier.TRAINING,
                count=len(group),
                state=RequestState.ACTIVE,
                approved_at=now,
            )
            for i, group in enumerate(groups)
        ],
        BATCH,
    )
    pools = GpuPool.objects.bulk_create(
        [
            GpuPool(
                project_id=r.project_id,
                request=r,
                cluster_id=cluster_of[node_of[group[0][1]]],
                name=f"pool-{r.pk}",
                workload_type=r.workload_type,
                tier=r.tier,
                state="active",
                created_at=now,
            )
            for r, group in zip(requests, groups, strict=True)
        ],
        BATCH,
    )
    Allocation.objects.bulk_create(
        (
            Allocation(
                pool=pool,
                project_id=pool.project_id,
                kind=kind,
                gpu_id=gpu_id,
                mig_instance_id=instance_id,
                replica=replica,
                resource_name="nvidia.com/gpu",
                product=product,
                profile_name=profile_name,
                compute_slices=slices,
                allocated_at=now,
            )
            for pool, group in zip(pools, groups, strict=True)
            for kind, gpu_id, instance_id, replica, product, profile_name, slices in group
        ),
        BATCH,
    )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    return {"nodes": len(nodes), "gpus": len(gpus), "mig_instances": len(instances), "allocations": len(held)}


# --- Approval ------------------------------------------------------------------------------------


def _spec_requests(project, user) -> list[PoolRequest]:
    """One unsaved one-unit request per spec the world offers: each MIG profile present per tier, each
    whole-GPU product; what approval would compete for."""
    specs = []
    mig = MigInstance.objects.present().values("profile__name", "profile__product", "gpu__node__tier").distinct()
    for row in mig.order_by():
        specs.append(
            dict(
                spec_kind=SpecKind.MIG,
                isolation="mig",
                product=row["profile__product"],
                profile_name=row["profile__name"],
                tier=row["gpu__node__tier"] or Tier.SLA_INFERENCE,
            )
        )
    whole = GpuCapacity.objects.present().filter(mig_mode_current=False, node__timeslice_replicas__lte=1)
    for product in sorted(set(whole.values_list("catalog_product", flat=True).order_by())):
        specs.append(dict(spec_kind=SpecKind.FULL, isolation="full", product=product, tier=Tier.TRAINING))
    return [
        PoolRequest(project=project, requested_by=user, count=1, state=RequestState.SUBMITTED, justification=MARK, **s)
        for s in specs
    ]


def _most_free(project, user) -> tuple[PoolRequest, dict[int, int]]:
    """The spec with the most free units in the fleet, and its free units per cluster."""
    best, most = None, {}
    for request in _spec_requests(project, user):
        free = units.free_by_cluster(request)
        if best is None or sum(free.values()) > sum(most.values()):
            best, most = request, free
    if best is None:
        raise RuntimeError("the database holds no GPU: build a fleet world first (bench fleet, or build_world())")
    return best, most


def measure_approval(project, user, operator) -> dict:
    template, free = _most_free(project, user)
    times, floors, queries = [], [], []
    for _ in range(APPROVAL_REPEAT):
        with rolled_back():
            request = PoolRequest.objects.create(**_fields(template))
            floors.append(timed(lambda r=request: list(_floor_lock(r))))
        with rolled_back(), mock.patch.object(services, "enqueue_provisioning"):
            request = PoolRequest.objects.create(**_fields(template))
            with CaptureQueriesContext(connection) as captured:
                times.append(timed(lambda r=request: services.approve(r, actor=operator)))
            queries.append(len(captured))
    approval, floor = statistics.median(times), statistics.median(floors)
    return {
        **with_floor("approval_ms", approval, floor, ms=True),
        "approval_free_units": sum(free.values()),
        "approval_free_units_one_cluster": units.usable_free(template, free),
        "approval_spec": units.unit_label(template),
        "approval_queries": max(queries),
    }


def _fields(request: PoolRequest) -> dict:
    names = ("project", "requested_by", "count", "state", "justification", "spec_kind", "isolation", "product")
    return {n: getattr(request, n) for n in (*names, "profile_name", "tier")}


def _floor_lock(request: PoolRequest):
    """The one query an approval cannot do without: lock `count` free units of the spec, skipping locked ones."""
    if request.spec_kind == SpecKind.MIG:
        candidates = units.mig_candidates(request)
    else:
        candidates = units.full_candidates(request)
    return take._lock(candidates).values_list("pk", flat=True)[: request.count]


# --- Queue and forecasts --------------------------------------------------------------------------


def _queued_mix(n: int, projects: list[int], user) -> list[PoolRequest]:
    """N queued requests: 70% eight whole H100 GPUs on one node, 20% four whole H200 GPUs (a cluster named
    on half of them), 10% one MIG unit of approval_spec(); a third production, a third staging, the rest
    development; projects spread over the world's."""
    tier, profile = approval_spec()
    clusters = list(Cluster.objects.order_by("pk").values_list("pk", flat=True)[:CLUSTERS])
    classes = (PriorityClass.PRODUCTION, PriorityClass.STAGING, PriorityClass.DEVELOPMENT)
    out = []
    for i in range(n):
        spec: dict = dict(spec_kind=SpecKind.FULL, isolation="full", tier=Tier.TRAINING, product="H100-80GB", count=8)
        if i % 10 in (7, 8):
            spec.update(product="H200-141GB", count=4, cluster_id=clusters[i % len(clusters)] if i % 2 else None)
        elif i % 10 == 9:
            spec = dict(
                spec_kind=SpecKind.MIG, isolation="mig", tier=tier, product=profile.product, profile_name=profile.name
            )
        out.append(
            PoolRequest(
                project_id=projects[(i * 7919) % len(projects)],
                requested_by=user,
                state=RequestState.QUEUED,
                wait_if_full=True,
                priority_class=classes[i % 3],
                justification=MARK,
                **spec,
            )
        )
    return out


def _create_queue(n: int, user) -> list[QueueEntry]:
    projects = list(Project.objects.order_by("pk").values_list("pk", flat=True)[:10_000])
    now = timezone.now()
    requests = PoolRequest.objects.bulk_create(_queued_mix(n, projects, user), BATCH)
    step = dt.timedelta(hours=QUEUE_BUILT_OVER_H) / n
    entries = QueueEntry.objects.bulk_create(
        [QueueEntry(request=r, queued_at=now - step * (n - i)) for i, r in enumerate(requests)], BATCH
    )
    # Each was submitted when it was queued (created_at is set on insert): one UPDATE from the entries.
    queued_at = QueueEntry.objects.filter(request=OuterRef("pk")).values("queued_at")[:1]
    PoolRequest.objects.filter(justification=MARK, requested_by=user).update(created_at=Subquery(queued_at))
    return entries


def measure_queue(n: int, user, *, forecast_samples: int = FORECAST_SAMPLES) -> dict:
    with rolled_back(), mock.patch.object(services, "enqueue_provisioning"):
        entries = _create_queue(n, user)
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE pools_poolrequest, pools_queueentry")

        def floor():
            queue._lock_queue()
            list(QueueEntry.objects.waiting().select_related("request__project", "operator_approved_by"))

        floor_s = timed(floor)
        passed = {}
        pass_s = timed(lambda: passed.update(result=queue.process()))
        result = passed["result"]
        step = max(1, len(entries) // max(1, forecast_samples))
        sample = [e.request for e in entries[::step][:forecast_samples]]
        forecasts, floors = [], []
        for request in sample:
            request.refresh_from_db()
            floors.append(timed(lambda r=request: units.read_free(r)))
            forecasts.append(timed(lambda r=request: forecast.estimate_start(r)))
    figures = {
        "queue_waiting": len(entries),
        **with_floor("queue_pass_s", pass_s, floor_s),
        "queue_approved": len(result.approved),
        "queue_flagged": len(result.flagged),
        "queue_blocked": len(result.blocked),
    }
    if not forecasts:
        return figures
    worst, worst_floor = max(forecasts), max(floors)
    return {
        **figures,
        **with_floor("forecast_ms", worst, worst_floor, ms=True),
        "forecast_p50_ms": in_ms(statistics.median(forecasts)),
        "forecast_samples": len(forecasts),
    }


# --- Discovery -----------------------------------------------------------------------------------


def measure_discovery(scale: float) -> dict:
    """Discovery of CLUSTERS simulated clusters of NODES_PER_CLUSTER x scale nodes, one served at a time."""
    nodes = max(4, round(NODES_PER_CLUSTER * scale))
    totals = {"list_parse": 0.0, "first": 0.0, "resync": 0.0}
    first_worst, queries = 0.0, set()
    gc.collect()
    gc.freeze()  # the simulated cluster's objects: keep the collector from rescanning them (as bench discovery)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for c in range(CLUSTERS):
                server, config = discovery_bench._serve(nodes, GPUS_PER_NODE, Path(tmp) / str(c), seed=100 + c)
                cluster = None
                try:
                    name = discovery_bench.unique_name(discovery_bench.BENCH_PREFIX, "fleet", c, nodes)
                    cluster = Cluster.objects.create(name=name, kubeconfig_path=str(config))
                    totals["list_parse"] += discovery_bench._list_parse_s(cluster)
                    inventories, _ = discovery_bench._read_inventories(cluster, server)
                    first = discovery_bench._first_sync(cluster, inventories)["total"]
                    totals["first"] += first
                    first_worst = max(first_worst, first)
                    resync, count = discovery_bench._resync(cluster.pk)
                    totals["resync"] += resync
                    queries.add(count)
                finally:
                    server.stop()
                    if cluster is not None:
                        discovery_bench.delete_cluster_rows(cluster)
                        cluster.delete()
    finally:
        gc.unfreeze()
    floor = totals["list_parse"]
    return {
        "discovery_clusters": CLUSTERS,
        "discovery_nodes": nodes * CLUSTERS,
        **with_floor("discovery_first_sync_s", totals["first"], floor),
        "discovery_first_sync_per_cluster_s": round(first_worst, 3),
        **with_floor("discovery_resync_s", totals["resync"], floor),
        "discovery_resync_queries": sorted(queries),
    }


# --- All of it -----------------------------------------------------------------------------------


def measure(scale: float = 1.0, *, discovery: bool = True, forecast_samples: int = FORECAST_SAMPLES) -> dict:
    """Every control-plane figure against the fleet world in the database; see the module docstring.
    `discovery=False` or `forecast_samples=0` leave those figures out (a quicker look)."""
    project = Project.objects.order_by("pk").first()
    if project is None:
        raise RuntimeError("the database holds no project: build a fleet world first (bench fleet, or build_world())")
    User = get_user_model()
    suffix = uuid.uuid4().hex[:8]
    user = User.objects.create_user(f"fleet-control-{suffix}")
    operator = User.objects.create_superuser(f"fleet-control-op-{suffix}", "", None)
    try:
        result: dict = {"scale": scale, "database": connection.vendor}
        result.update(measure_approval(project, user, operator))
        waiting = max(10, round(QUEUE_WAITING * scale))
        result.update(measure_queue(waiting, user, forecast_samples=forecast_samples))
        if discovery:
            result.update(measure_discovery(scale))
    finally:
        PoolRequest.objects.filter(justification=MARK, requested_by=user).delete()
        user.delete()
        operator.delete()
    for figure, (bounded, limit) in TARGETS.items():
        if figure in result:
            result[f"{figure}_target"] = f"{bounded} <= {limit:g}"
            result[f"{figure}_met"] = result[bounded] <= limit
    result["load_average_1m"] = round(os.getloadavg()[0], 2)
    result["cpus"] = os.cpu_count()
    return result


def free_units_count() -> int:
    """Free MIG instances and whole GPUs in the database (a quick look at the world)."""
    return MigInstance.objects.free().count() + GpuCapacity.objects.free().aggregate(n=Count("pk"))["n"]

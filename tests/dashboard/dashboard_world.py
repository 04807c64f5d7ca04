"""A small, exact fixture world for the dashboard and project-view tests (and the browser tests).

cluster "alpha"
  node a1, H100-80GB, MIG on
    GPU 0: 3g.40gb @0  held by team-a/inference, workload running  -> In Use
           3g.40gb @4  held by team-a/inference, idle               -> Ready
    GPU 1: 2g.20gb @0  free                                         -> Available
           1g.10gb @4  held by team-b/batch, workload running       -> In Use
  node a2, H100-80GB, MIG off
    GPU 0: whole GPU   held by team-a/training, idle                -> Ready
  node a3: gone (not shown); a lost GPU on a2 (not shown)
cluster "beta"
  node b1, A30-24GB, MIG on
    GPU 0: 2g.12gb @0, 2g.12gb @2  free                             -> Available x 2
  node b2, H100-80GB, MIG off
    GPU 0: whole GPU   free                                         -> Available

One submitted request of team-a waits for approval.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.utils import timezone

from capacity.models import Cluster, GpuCapacity, MigInstance, MigProfile, NodeCapacity, WorkloadProfile
from pools.models import Allocation, GpuPool, PoolRequest
from tenancy.models import Project

H100 = "NVIDIA H100 80GB HBM3"
POOL_AGE = timedelta(days=2)
BUCKET = timedelta(minutes=5)
A30 = "NVIDIA A30"


@dataclass
class World:
    alpha: Cluster
    beta: Cluster
    gpus: dict[str, GpuCapacity]
    instances: dict[str, MigInstance]
    pools: dict[str, GpuPool]
    pending: PoolRequest | None
    extra: dict = field(default_factory=dict)


def _node(cluster, name, product, count, **kw):
    return NodeCapacity.objects.create(
        cluster=cluster, name=name, gpu_product=product.replace(" ", "-"), gpu_count=count, ready=True, **kw
    )


def _gpu(node, index, product, catalog, mig, **kw):
    return GpuCapacity.objects.create(
        node=node,
        index=index,
        uuid=f"GPU-{node.name}-{index}",
        product=product,
        catalog_product=catalog,
        memory_mib=81559 if catalog.startswith("H100") else 24576,
        mig_mode_current=mig,
        mig_mode_pending=mig,
        **kw,
    )


def _instance(gpu, name, start):
    profile = MigProfile.objects.get(product=gpu.catalog_product, name=name)
    placement = profile.valid_placements.get(start=start)
    return MigInstance.objects.create(
        gpu=gpu,
        profile=profile,
        placement=placement,
        placement_start=start,
        placement_size=placement.size,
        uuid=f"MIG-{gpu.uuid}-{start}",
    )


def _pool(project, cluster, name, spec_kind, profile_name, count, tags=()):
    request = PoolRequest.objects.create(
        project=project,
        name=name,
        cluster=cluster,
        product="H100-80GB",
        spec_kind=spec_kind,
        isolation="mig" if spec_kind == "mig" else "full",
        profile_name=profile_name,
        count=count,
        state="active",
        approved_at=timezone.now(),
    )
    return GpuPool.objects.create(
        project=project,
        request=request,
        cluster=cluster,
        name=name,
        workload_type="inference" if spec_kind == "mig" else "training",
        tags=list(tags),
        state="active",
        created_at=timezone.now() - POOL_AGE,
    )


def _allocate(pool, gpu, instance=None):
    return Allocation.objects.create(
        allocated_at=pool.created_at,
        pool=pool,
        project=pool.project,
        kind="mig" if instance else "full",
        gpu=gpu,
        mig_instance=instance,
        resource_name=instance.profile.resource_name if instance else "nvidia.com/gpu",
        product=gpu.catalog_product,
        profile_name=instance.profile.name if instance else "",
        compute_slices=instance.profile.compute_slices if instance else 7,
    )


def _workload(gpu, instance, project, pod):
    return WorkloadProfile.objects.create(
        cluster=gpu.node.cluster,
        namespace=project.namespace,
        pod_name=pod,
        pod_uid=f"uid-{pod}",
        node=gpu.node,
        gpu=gpu,
        mig_instance=instance,
        resource_name=instance.profile.resource_name if instance else "nvidia.com/gpu",
        project=project,
    )


def build_world(team_a: Project, team_b: Project, *, pending: bool = True) -> World:
    alpha = Cluster.objects.create(name="alpha", kubeconfig_path="/tmp/alpha", status="ok")
    beta = Cluster.objects.create(name="beta", kubeconfig_path="/tmp/beta", status="ok")
    a1 = _node(alpha, "a1", H100, 2, mig_strategy="mixed")
    a2 = _node(alpha, "a2", H100, 1)
    gone = _node(alpha, "a3", H100, 1, gone_at=timezone.now())
    b1 = _node(beta, "b1", A30, 1, mig_strategy="mixed")
    b2 = _node(beta, "b2", H100, 1)
    gpus = {
        "a1-0": _gpu(a1, 0, H100, "H100-80GB", True),
        "a1-1": _gpu(a1, 1, H100, "H100-80GB", True),
        "a2-0": _gpu(a2, 0, H100, "H100-80GB", False),
        "a2-lost": _gpu(a2, 1, H100, "H100-80GB", False, lost_at=timezone.now(), health="lost"),
        "a3-0": _gpu(gone, 0, H100, "H100-80GB", False),
        "b1-0": _gpu(b1, 0, A30, "A30-24GB", True),
        "b2-0": _gpu(b2, 0, H100, "H100-80GB", False),
    }
    instances = {
        "a1-0-3g@0": _instance(gpus["a1-0"], "3g.40gb", 0),
        "a1-0-3g@4": _instance(gpus["a1-0"], "3g.40gb", 4),
        "a1-1-2g@0": _instance(gpus["a1-1"], "2g.20gb", 0),
        "a1-1-1g@4": _instance(gpus["a1-1"], "1g.10gb", 4),
        "b1-0-2g@0": _instance(gpus["b1-0"], "2g.12gb", 0),
        "b1-0-2g@2": _instance(gpus["b1-0"], "2g.12gb", 2),
    }
    pools = {
        "inference": _pool(team_a, alpha, "inference", "mig", "3g.40gb", 2, tags=["3g.40gb", "sla"]),
        "training": _pool(team_a, alpha, "training", "full", "", 1, tags=["full"]),
        "batch": _pool(team_b, alpha, "batch", "mig", "1g.10gb", 1, tags=["1g.10gb"]),
    }
    _allocate(pools["inference"], gpus["a1-0"], instances["a1-0-3g@0"])
    _allocate(pools["inference"], gpus["a1-0"], instances["a1-0-3g@4"])
    _allocate(pools["training"], gpus["a2-0"])
    _allocate(pools["batch"], gpus["a1-1"], instances["a1-1-1g@4"])
    _workload(gpus["a1-0"], instances["a1-0-3g@0"], team_a, "serve-0")
    _workload(gpus["a1-1"], instances["a1-1-1g@4"], team_b, "batch-0")
    waiting = None
    if pending:
        waiting = PoolRequest.objects.create(
            project=team_a,
            name="more",
            product="H100-80GB",
            spec_kind="mig",
            profile_name="2g.20gb",
            count=1,
            state="submitted",
        )
    return World(alpha=alpha, beta=beta, gpus=gpus, instances=instances, pools=pools, pending=waiting)


def add_signals(world: World, *, now=None) -> dict:
    """Monitoring and billing rows on top of the world, with figures the tests can check exactly.

    - metrics: a series per GPU and MIG instance; 5-minute rollups over the last hour (power 300 W
      per GPU, SM activity 40 % on every series, utilisation 55 % on whole GPUs) and one fresh sample.
    - health: open critical XID on alpha a1 GPU 1; open thermal throttle (warning) on alpha a2 GPU 0;
      open ECC-ish warning on beta b1 GPU 0; a resolved critical event on alpha a1 GPU 0 (not counted).
    - idle: an open idle flag on team-a's idle 3g.40gb @4.
    - billing, this month: team-a inference 3g.40gb at 1.25/h: 3 unit-hours (one with 30 min of
      health credit), 2 of them measured at SM 0.5; team-b batch 1g.10gb at 0.357143/h: 1 hour.
    """
    from decimal import Decimal

    from billing.models import UsageRecord
    from billing.periods import month_bounds
    from monitoring.models import HealthEvent, IdleReservation, Rollup5m, RollupRun, Sample, Series

    now = now or timezone.now()
    series = {}
    for gpu in world.gpus.values():
        if gpu.lost_at or gpu.node.gone_at:
            continue
        series[(gpu.pk, None)] = Series.objects.create(gpu=gpu)
    for instance in world.instances.values():
        series[(instance.gpu_id, instance.pk)] = Series.objects.create(gpu=instance.gpu, mig_instance=instance)
    # Rollups are final up to the end of the bucket holding the fresh sample, as the rollup job leaves them.
    sampled_at = now - timedelta(seconds=10)
    complete_until = sampled_at.replace(second=0, microsecond=0) - timedelta(minutes=sampled_at.minute % 5) + BUCKET
    RollupRun.objects.update_or_create(level="5m", defaults={"complete_until": complete_until})
    start = complete_until - timedelta(hours=1)
    rollups, samples = [], []
    for (gpu_id, mig_id), s in series.items():
        whole = mig_id is None
        full_gpu = whole and not GpuCapacity.objects.get(pk=gpu_id).mig_mode_current
        for step in range(12):
            rollups.append(
                Rollup5m(
                    series=s,
                    bucket=start + timedelta(minutes=5 * step),
                    samples=10,
                    power_w_avg=300.0 if whole else None,
                    sm_active_avg=40.0,
                    gpu_util_avg=55.0 if full_gpu else None,
                    temp_c_avg=60.0 if whole else None,
                )
            )
        samples.append(
            Sample(
                series=s,
                ts=sampled_at,
                power_w=350.0 if whole else None,
                sm_active=42.0,
                temp_c=61 if whole else None,
                gpu_util=57 if full_gpu else None,
            )
        )
    Rollup5m.objects.bulk_create(rollups)
    Sample.objects.bulk_create(samples)
    events = [
        HealthEvent.objects.create(
            gpu=world.gpus["a1-1"], rule="xid_critical", level="critical", value=79, message="XID 79: fell off the bus"
        ),
        HealthEvent.objects.create(gpu=world.gpus["a2-0"], rule="thermal_throttle", level="warning", message="hot"),
        HealthEvent.objects.create(gpu=world.gpus["b1-0"], rule="xid_warning", level="warning", value=13),
        HealthEvent.objects.create(
            gpu=world.gpus["a1-0"], rule="ecc_dbe", level="critical", resolved_at=now, resolution="reset"
        ),
    ]
    idle_allocation = Allocation.objects.get(mig_instance=world.instances["a1-0-3g@4"])
    IdleReservation.objects.create(
        allocation=idle_allocation,
        window_start=now - timedelta(hours=24),
        window_end=now,
        sm_active_avg=0.4,
        coverage=0.98,
        proposal="release",
    )
    first_hour, _ = month_bounds(now.date())
    busy = Allocation.objects.get(mig_instance=world.instances["a1-0-3g@0"])
    batch = Allocation.objects.get(mig_instance=world.instances["a1-1-1g@4"])

    def record(allocation, hour, rate, **kw):
        return UsageRecord(
            allocation=allocation,
            hour=first_hour + timedelta(hours=hour),
            project=allocation.project,
            pool=allocation.pool,
            kind=allocation.kind,
            product=allocation.product,
            profile_name=allocation.profile_name,
            seconds=3600,
            hourly_rate=Decimal(rate),
            **kw,
        )

    UsageRecord.objects.bulk_create(
        [
            record(busy, 0, "1.250000", sm_activity=Decimal("0.5")),
            record(busy, 1, "1.250000", sm_activity=Decimal("0.5")),
            record(idle_allocation, 0, "1.250000", health_credit_seconds=1800),
            record(batch, 0, "0.357143"),
        ]
    )
    return {"series": series, "events": events}

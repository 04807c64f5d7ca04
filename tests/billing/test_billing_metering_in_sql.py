"""Metering an hour in SQL (billing.backends.meter_plain_hour) writes exactly the rows of the per-unit path.

A random multi-cluster world (full GPUs, MIG profiles, time-slice replicas on nodes of different replica
counts, vGPUs; clocks starting and stopping at any microsecond; request ends; failed provisioning with
and without a history; critical health events on GPUs and MIG instances; two rate cards, one with an
off-peak window; allocations created late with a backdated start) is metered hour by hour, each hour
first the per-unit way (rolled back) then the SQL way, and every record must be the same.
"""

import random
from datetime import timedelta
from decimal import Decimal

import pytest
from billing_helpers import at, transition
from django.db import transaction

from billing import services
from billing.models import UsageRecord
from billing.services import metering
from capacity.models import Cluster, GpuCapacity, NodeCapacity
from monitoring.models import HealthEvent
from pricing.models import RateCard

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

START = at("2026-03-10 00:00")
HOURS = 30
SPECS = (
    ("full", "H100-80GB", ""),
    ("mig", "H100-80GB", "1g.10gb"),
    ("mig", "H100-80GB", "3g.40gb"),
    ("timeslice", "H100-80GB", ""),
    ("vgpu", "H100-80GB", "H100XM-20C"),
)


class _Undo(Exception):
    """Rolls the reference metering back."""


def _table() -> list[tuple]:
    return sorted(UsageRecord.objects.values_list(*metering.RECORD_COLUMNS))


def _meter_both_ways(hour) -> tuple[tuple[int, list], tuple[int, list]]:
    """(offered, every record) after metering `hour` per unit (then undone) and in SQL (kept)."""
    reference = None
    try:
        with transaction.atomic():
            reference = (metering.meter_hour(hour, in_sql=False), _table())
            raise _Undo
    except _Undo:
        pass
    in_sql = metering.meter_hour(hour, in_sql=True)
    return reference, (in_sql, _table())


def _other_clusters_gpus() -> list[GpuCapacity]:
    """GPUs on two more clusters whose nodes time-slice into 2 and 7 replicas (the fixture's node: 4)."""
    gpus = []
    for name, replicas in (("west", 2), ("east", 7)):
        cluster = Cluster.objects.create(name=name, kubeconfig_path="/dev/null")
        node = NodeCapacity.objects.create(cluster=cluster, name=f"{name}-1", gpu_count=8, timeslice_replicas=replicas)
        gpus += [
            GpuCapacity.objects.create(
                node=node, index=i, uuid=f"GPU-{name}-{i}", product="NVIDIA H100", catalog_product="H100-80GB"
            )
            for i in range(8)
        ]
    return gpus


def _allocation(rng: random.Random, project, allocate, gpus, *, start=None):
    kind, product, profile = rng.choice(SPECS)
    start = start or START + timedelta(seconds=rng.uniform(-6 * 3600, HOURS * 3600))
    end = None if rng.random() < 0.4 else start + timedelta(seconds=rng.choice([0.4, 1.5, 59.999999, 3600, 7300.5]))
    if end is not None and rng.random() < 0.5:
        end = start + timedelta(seconds=rng.uniform(1, 12 * 3600))
    options = {}
    roll = rng.random()
    if roll < 0.1:
        options.update(request_state="failed", pool_state="failed", provisioned=None)
    elif roll < 0.2:
        options.update(request_state="failed")
    elif roll < 0.3:
        options.update(request_end=start + timedelta(seconds=rng.uniform(600, 10 * 3600)))
    elif roll < 0.35:
        options.update(pool_state="provisioning", provisioned=None)  # never billed
    if kind == "timeslice" and rng.random() < 0.7:  # replicas of the other clusters' nodes
        options["gpu"] = rng.choice(gpus)
    allocation = allocate(project, start, end, kind=kind, product=product, profile=profile, **options)
    request = allocation.pool.request
    if options.get("request_state") == "failed" and "pool_state" not in options:
        # Active once, failed for a while, then active again (a retried provisioning).
        failed_at = start + timedelta(seconds=rng.uniform(0, 5 * 3600))
        transition(request, "provisioning", "active", start.isoformat(sep=" ")[:16])
        transition(request, "active", "failed", failed_at.isoformat(sep=" ")[:16])
        if rng.random() < 0.5:
            back = failed_at + timedelta(seconds=rng.uniform(600, 4 * 3600))
            transition(request, "failed", "active", back.isoformat(sep=" ")[:16])
    if rng.random() < 0.15:
        opened = start + timedelta(seconds=rng.uniform(-3600, 6 * 3600))
        resolved = None if rng.random() < 0.3 else opened + timedelta(seconds=rng.uniform(1, 3 * 3600))
        HealthEvent.objects.create(
            gpu=allocation.gpu,
            mig_instance=allocation.mig_instance if rng.random() < 0.5 else None,
            rule="xid_critical",
            level="critical" if rng.random() < 0.8 else "warning",
            opened_at=opened,
            last_seen_at=opened,
            resolved_at=resolved,
        )
    return allocation


@pytest.mark.parametrize("seed", [1, 28, 2026])
def test_sql_metering_writes_the_per_unit_rows(project, allocate, seed):
    rng = random.Random(seed)
    gpus = _other_clusters_gpus()
    card = services.create_rate_card(
        name="Spring", effective_from=START + timedelta(hours=11), full_prices={"H100-80GB": Decimal("3.10")}
    )
    RateCard.objects.filter(pk=card.pk).update(
        off_peak_start_hour=20, off_peak_end_hour=4, off_peak_multiplier=Decimal("0.7")
    )
    for _ in range(60):
        _allocation(rng, project, allocate, gpus)

    hour = START - timedelta(hours=6)
    offered = 0
    while hour < START + timedelta(hours=HOURS + 2):
        if rng.random() < 0.2:  # created now, started hours ago: backfilled from its first hour
            _allocation(rng, project, allocate, gpus, start=hour - timedelta(seconds=rng.uniform(1, 5 * 3600)))
        reference, in_sql = _meter_both_ways(hour)
        assert in_sql == reference, hour
        offered += in_sql[0]
        hour += timedelta(hours=1)

    records = UsageRecord.objects.all()
    assert offered == records.count() > 100
    # The world reached every branch: credits of both kinds, several rates, replicas and kinds.
    assert records.filter(failed_credit_seconds__gt=0).exists()
    assert records.filter(health_credit_seconds__gt=0).exists()
    assert records.values("hourly_rate").distinct().count() > 5
    assert {1, 2, 4, 7} <= set(records.values_list("replicas", flat=True))
    assert set(records.values_list("kind", flat=True)) == {k for k, _, _ in SPECS}

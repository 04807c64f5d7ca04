"""`python manage.py bench billing --allocations 5000 --days 30`: metering one hour and closing a month.

Runs on PostgreSQL only. Creates its own cluster, GPUs, projects, requests, pools and allocations
(bulk_create, the minimum the pools models need), backfills `days` x 24 hourly usage records per
allocation with one INSERT ... SELECT over generate_series (the rate of each spec from the rate
card, a synthetic SM activity and energy on 80 % of them so showback is exercised), then times:

- meter_hour_s: billing.services.meter_usage for the next hour: the watermark claim, the query of
  every running allocation, the late-allocation probe, pricing, bulk INSERT ... ON CONFLICT, and the
  credit/showback refresh;
- close_month_s: billing.services.close_month for the month: statements for every project from all
  usage rows (credits refreshed, one GROUP BY, lines and totals written);
- sql_floor_s: one raw SQL GROUP BY over the same rows giving the same per-line reserved sums.

Everything it created is deleted afterwards and the metering watermark restored. The month used
is January 2001, far from any real data.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.db import connection, transaction

from billing import services
from billing.models import MeteringWatermark, Statement, UsageRecord
from billing.periods import HOUR, month_bounds
from billing.services import PriceBook
from capacity.choices import SpecKind
from capacity.models import Cluster, GpuCapacity, MigInstance, MigProfile, NodeCapacity
from pools.models import Allocation, GpuPool, PoolRequest
from pricing.rates import spec_key
from tenancy.models import Project

from .registry import Smoke, arg, benchmark
from .targets import Expr, correctness, performance

PERIOD = date(2001, 1, 1)
START = datetime(2001, 1, 1, tzinfo=UTC)
# (kind, product, profile) by allocation number modulo 5: two full GPUs, two MIG profiles, one time-slice replica.
SPECS = [
    ("full", "H100-80GB", ""),
    ("full", "H200-141GB", ""),
    ("mig", "H100-80GB", "3g.40gb"),
    ("mig", "H100-80GB", "1g.10gb"),
    ("timeslice", "A100-80GB", ""),
]
REPLICAS = 4
FLOOR_SQL = """
SELECT project_id, pool_id, kind, product, profile_name, replicas, hourly_rate,
       SUM(seconds), SUM(hourly_rate * seconds)
FROM billing_usagerecord
WHERE hour >= %s AND hour < %s
GROUP BY project_id, pool_id, kind, product, profile_name, replicas, hourly_rate
"""


@benchmark(
    "billing",
    help="Meter one hour for N allocations and close a month of their usage (PostgreSQL).",
    arguments=[
        arg("--allocations", type=int, default=5000),
        arg("--days", type=int, default=30, help="Days of usage to backfill (at most 30: all in one month)."),
        arg("--projects", type=int, default=200),
    ],
    targets=[
        correctness("meter_hour_records", "==", "allocations"),
        correctness("statements", "==", "projects"),
        correctness("statement_lines", "==", "sql_floor_groups"),
        # Statement lines are rounded to the cent, the floor's sum once: at most a cent apart per line.
        correctness(
            Expr(
                "|reserved_total - floor_total|",
                lambda r: abs(Decimal(r["reserved_total"]) - Decimal(r["floor_total"])),
            ),
            "<=",
            Expr("0.01 x statement_lines", lambda r: Decimal("0.01") * r["statement_lines"]),
        ),
        performance("meter_hour_s", "<=", 2),
        performance("ratio", "<=", 3),
    ],
    smoke=Smoke(("--allocations", "50", "--days", "1", "--projects", "5"), needs=("postgresql",)),
)
def run_billing_bench(*, stdout, allocations: int = 5000, days: int = 30, projects: int = 200) -> dict:
    if connection.vendor != "postgresql":
        raise SystemExit("bench billing needs PostgreSQL: set DATABASE_URL=postgres://...")
    if not 1 <= days <= 30:
        raise SystemExit("--days must be 1..30 (the usage, plus the metered hour, stays in one month)")
    tag = uuid.uuid4().hex[:8]
    world = _World(tag)
    watermark = _save_watermark()
    try:
        t0 = time.perf_counter()
        world.build(allocations=allocations, projects=min(projects, allocations))
        stdout.write(f"built {allocations} allocations in {time.perf_counter() - t0:.1f}s")
        t0 = time.perf_counter()
        rows = world.backfill(days)
        stdout.write(f"backfilled {rows} usage rows in {time.perf_counter() - t0:.1f}s")
        return _measure(world, days, stdout)
    finally:
        t0 = time.perf_counter()
        world.clean_up()
        _restore_watermark(watermark)
        stdout.write(f"cleaned up in {time.perf_counter() - t0:.1f}s")


def _measure(world: _World, days: int, stdout) -> dict:
    hour = START + timedelta(days=days)
    MeteringWatermark.objects.update_or_create(pk=1, defaults={"metered_until": hour})
    t0 = time.perf_counter()
    metered = services.meter_usage(now=hour + HOUR + timedelta(minutes=5))
    meter_hour_s = time.perf_counter() - t0
    assert metered.hours == 1, metered

    start, end = month_bounds(PERIOD)
    # Pretend the rest of the month was metered too, so the close times statements only.
    MeteringWatermark.objects.filter(pk=1).update(metered_until=end)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE billing_usagerecord")
        cursor.execute(FLOOR_SQL, [start, end])  # warm the cache once, untimed
        cursor.fetchall()
        t0 = time.perf_counter()
        cursor.execute(FLOOR_SQL, [start, end])
        floor_rows = cursor.fetchall()
        sql_floor_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    statements = services.close_month(PERIOD)
    close_month_s = time.perf_counter() - t0

    usage_rows = UsageRecord.objects.filter(project_id__in=world.project_ids).count()
    floor_total = sum((Decimal(r[8]) for r in floor_rows), Decimal(0)) / 3600
    stated = sum((s.reserved_amount for s in Statement.objects.filter(pk__in=[s.pk for s in statements])), Decimal(0))
    return {
        "allocations": len(world.allocation_ids),
        "projects": len(world.project_ids),
        "days": days,
        "usage_rows": usage_rows,
        "meter_hour_s": round(meter_hour_s, 3),
        "meter_hour_records": metered.records,
        "close_month_s": round(close_month_s, 3),
        "statements": len(statements),
        "statement_lines": sum(len(world.lines_of(s)) for s in statements),
        "sql_floor_s": round(sql_floor_s, 3),
        "sql_floor_groups": len(floor_rows),
        "ratio": round(close_month_s / sql_floor_s, 2) if sql_floor_s else None,
        "reserved_total": f"{stated:f}",
        "floor_total": f"{floor_total.quantize(Decimal('0.01')):f}",
    }


def _save_watermark():
    return MeteringWatermark.objects.filter(pk=1).values_list("metered_until", flat=True).first()


def _restore_watermark(value) -> None:
    if value is None:
        MeteringWatermark.objects.filter(pk=1).delete()
    else:
        MeteringWatermark.objects.update_or_create(pk=1, defaults={"metered_until": value})


class _World:
    """The bench's own capacity, projects and allocations, and how to remove them again."""

    def __init__(self, tag: str):
        self.tag = tag
        self.cluster_id = None
        self.project_ids: list[int] = []
        self.allocation_ids: list[int] = []

    def build(self, *, allocations: int, projects: int) -> None:
        with transaction.atomic():
            cluster = Cluster.objects.create(name=f"bench-billing-{self.tag}", kubeconfig_path="/dev/null")
            self.cluster_id = cluster.pk
            nodes = NodeCapacity.objects.bulk_create(
                NodeCapacity(cluster=cluster, name=f"node-{i}", gpu_count=8, timeslice_replicas=REPLICAS)
                for i in range((allocations + 7) // 8)
            )
            gpus = GpuCapacity.objects.bulk_create(
                GpuCapacity(
                    node=nodes[i // 8],
                    index=i % 8,
                    uuid=f"GPU-bench-{self.tag}-{i}",
                    product=SPECS[i % 5][1],
                    catalog_product=SPECS[i % 5][1],
                )
                for i in range(allocations)
            )
            profiles = {(p.product, p.name): p for p in MigProfile.objects.prefetch_related("valid_placements")}
            migs = {}
            for i in range(allocations):
                kind, product, profile = SPECS[i % 5]
                if kind == "mig":
                    p = profiles[(product, profile)]
                    placement = p.valid_placements.all()[0]
                    migs[i] = MigInstance(
                        gpu=gpus[i],
                        profile=p,
                        placement=placement,
                        placement_start=placement.start,
                        placement_size=placement.size,
                        uuid=f"MIG-bench-{self.tag}-{i}",
                    )
            MigInstance.objects.bulk_create(migs.values())
            project_rows = Project.objects.bulk_create(
                Project(name=f"Bench {self.tag} {p}", slug=f"bench-{self.tag}-{p}", namespace=f"bench-{self.tag}-{p}")
                for p in range(projects)
            )
            self.project_ids = [p.pk for p in project_rows]
            requests = PoolRequest.objects.bulk_create(
                PoolRequest(
                    project=project,
                    spec_kind=kind,
                    product=product,
                    profile_name=profile,
                    state="active",
                    start_at=START,
                    approved_at=START,
                )
                for project in project_rows
                for kind, product, profile in SPECS
            )
            pools = GpuPool.objects.bulk_create(
                GpuPool(
                    project_id=request.project_id,
                    request=request,
                    cluster=cluster,
                    name=f"{request.spec_kind}-{request.product}-{request.profile_name or 'all'}",
                    workload_type="inference",
                    state="active",
                    created_at=START,
                )
                for request in requests
            )
            pool_of = {(pool.project_id, i % 5): pool for i, pool in enumerate(pools)}
            rows = []
            for i in range(allocations):
                kind, product, profile = SPECS[i % 5]
                project = project_rows[(i // 5) % projects]
                rows.append(
                    Allocation(
                        pool=pool_of[(project.pk, i % 5)],
                        project=project,
                        kind=kind,
                        gpu=gpus[i],
                        mig_instance=migs.get(i),
                        resource_name="nvidia.com/gpu",
                        product=product,
                        profile_name=profile,
                        compute_slices=migs[i].profile.compute_slices if i in migs else 7,
                        allocated_at=START,
                    )
                )
            self.allocation_ids = [a.pk for a in Allocation.objects.bulk_create(rows, batch_size=2000)]

    def backfill(self, days: int) -> int:
        """days x 24 full hours per allocation, in one INSERT ... SELECT; returns the rows written."""

        book = PriceBook()
        card = book.card_at(START)
        prices = [
            (kind, product, profile, str(book.price(card, spec_key(kind, product, profile, REPLICAS), None)))
            for kind, product, profile in SPECS
        ]
        values = ", ".join(["(%s, %s, %s, %s::numeric)"] * len(prices))
        params = [x for row in prices for x in row]
        sql = f"""
        INSERT INTO billing_usagerecord
            (allocation_id, hour, project_id, pool_id, kind, product, profile_name, replicas, seconds,
             health_credit_seconds, failed_credit_seconds, hourly_rate, rate_card_id, sm_activity, energy_kwh)
        SELECT a.id, h, a.project_id, a.pool_id, a.kind, a.product, a.profile_name,
               CASE WHEN a.kind = '{SpecKind.TIMESLICE}' THEN {REPLICAS} ELSE 1 END, 3600, 0, 0, r.rate, %s,
               CASE WHEN random() < 0.8 THEN round(random()::numeric, 4) END,
               CASE WHEN random() < 0.8 THEN round((random() * 0.7)::numeric, 6) END
        FROM pools_allocation a
        JOIN (VALUES {values}) AS r(kind, product, profile_name, rate)
          ON r.kind = a.kind AND r.product = a.product AND r.profile_name = a.profile_name
        CROSS JOIN generate_series(%s::timestamptz, %s::timestamptz, interval '1 hour') AS h
        WHERE a.pool_id IN (SELECT id FROM pools_gpupool WHERE cluster_id = %s)
        """
        last = START + timedelta(days=days) - timedelta(hours=1)
        with connection.cursor() as cursor:
            cursor.execute(sql, [card.pk, *params, START, last, self.cluster_id])
            written = cursor.rowcount
            cursor.execute("ANALYZE billing_usagerecord")
        return written

    def lines_of(self, statement) -> list:
        return list(statement.lines.all())

    def clean_up(self) -> None:
        if self.cluster_id is None:
            return
        ids = self.project_ids
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM billing_usagerecord WHERE project_id = ANY(%s)", [ids])
            # The usage table has no index on pool_id (see UsageRecord): without a vacuum, each pool
            # deleted below would scan millions of dead rows for its foreign-key check.
            cursor.execute("VACUUM billing_usagerecord")
        steps = [
            "DELETE FROM billing_statementline WHERE statement_id IN "
            "(SELECT id FROM billing_statement WHERE project_id = ANY(%s) AND state = 'draft')",
            "DELETE FROM billing_statement WHERE project_id = ANY(%s) AND state = 'draft'",
            "DELETE FROM pools_allocation WHERE project_id = ANY(%s)",
            "DELETE FROM pools_gpupool WHERE project_id = ANY(%s)",
            "DELETE FROM pools_poolrequest WHERE project_id = ANY(%s)",
        ]
        with transaction.atomic(), connection.cursor() as cursor:
            for sql in steps:
                cursor.execute(sql, [ids])
            cursor.execute(
                "DELETE FROM capacity_miginstance WHERE gpu_id IN (SELECT g.id FROM capacity_gpucapacity g "
                "JOIN capacity_nodecapacity n ON n.id = g.node_id WHERE n.cluster_id = %s)",
                [self.cluster_id],
            )
            cursor.execute(
                "DELETE FROM capacity_gpucapacity WHERE node_id IN "
                "(SELECT id FROM capacity_nodecapacity WHERE cluster_id = %s)",
                [self.cluster_id],
            )
            cursor.execute("DELETE FROM capacity_nodecapacity WHERE cluster_id = %s", [self.cluster_id])
            cursor.execute("DELETE FROM pools_project WHERE id = ANY(%s)", [ids])
            cursor.execute("DELETE FROM capacity_cluster WHERE id = %s", [self.cluster_id])

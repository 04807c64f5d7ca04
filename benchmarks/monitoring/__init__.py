"""`python manage.py bench ingest`: sample ingestion, storage size, rollups and a pool query on PostgreSQL.

It builds its own scratch fleet (a cluster, nodes, GPUs, MIG instances, their series; later a project
with a pool of 8 MIG instances), writes synthetic polls through the real ingest path, and removes
everything afterwards. Figures:

- ingest_samples_per_s: `ingest_samples()` on whole poll cycles (one call per 30 s poll of the fleet);
- copy_floor_samples_per_s: a raw binary COPY of the same rows into an unindexed table, same run;
- ratio = ingest / floor; bytes_per_sample = (table + indexes) / rows after the ingest;
- rollup_hour_s: 5-minute and hourly rollups of the hour holding the ingested minutes, all series;
- pool_24h_query_ms: one pool of 8 MIG instances, 24 h at 5-minute steps (the API's read path:
  rollups + raw tail) while 24 h of raw samples for --query-series series are in the table
  (median of 5 warm runs); pool_24h_raw_query_ms: the same read aggregating raw samples only;
  series_2h_raw_query_ms: one series' raw samples over 2 h (median of 5).
Extra figures: staging_ingest_samples_per_s (always COPY -> temp table -> INSERT ... ON CONFLICT),
node_batch_samples_per_s (one small transaction per node, as node agents write).
"""

from __future__ import annotations

import statistics
import time
import uuid as uuidlib
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from capacity.models import Cluster, GpuCapacity, MigInstance, MigProfile, NodeCapacity
from monitoring import readers
from monitoring.choices import RollupLevel
from monitoring.models import SAMPLE_COLUMNS, SAMPLE_PG_TYPES, Rollup1h, Rollup5m, RollupRun, Sample, Series
from monitoring.services.ingest import ingest_samples
from monitoring.services.rollups import rollup_1h, rollup_5m
from pools.models import Allocation, GpuPool, PoolRequest
from tenancy.models import Project

from ..registry import Smoke, arg, benchmark
from ..targets import correctness, performance

PER_NODE = 8
INTERVAL_S = 30


def _say(stdout, text: str) -> None:
    if stdout is not None:
        stdout.write(f"# {text}")


@benchmark(
    "ingest",
    help="Sample ingestion vs a raw COPY floor, bytes per sample, rollups, a pool's 24 h query (PostgreSQL).",
    arguments=[
        arg("--gpus", type=int, default=16000),
        arg("--mig", type=int, default=56000, help="MIG instances (7 per MIG-enabled GPU)"),
        arg("--minutes", type=int, default=10, help="Minutes of 30 s polls to ingest"),
        arg("--query-series", type=int, default=2000, help="Series with 24 h of raw samples for the query"),
    ],
    targets=[
        correctness("stored", "==", "samples"),
        correctness("pool_24h_points", "==", 288),
        performance("ingest_samples_per_s", ">=", 100_000),
        performance("ratio", ">=", 0.4),
        performance("bytes_per_sample", "<=", 120),
        performance("rollup_hour_s", "<=", 10),
        performance("pool_24h_query_ms", "<=", 200),
    ],
    smoke=Smoke(("--gpus", "16", "--mig", "56", "--minutes", "1", "--query-series", "8"), needs=("postgresql",)),
)
def ingest(*, stdout=None, gpus: int, mig: int, minutes: int, query_series: int) -> dict:
    if connection.vendor != "postgresql":
        return {"error": "the ingest benchmark needs PostgreSQL (DATABASE_URL=postgres://...)"}
    if mig > gpus * 7:
        return {"error": "--mig may be at most 7 x --gpus"}
    bench = Bench(gpus=gpus, mig=mig, stdout=stdout)
    try:
        return bench.run(minutes=minutes, query_series=min(query_series, mig))
    finally:
        try:
            bench.cleanup()
        except Exception as exc:  # never lose the figures to a clean-up problem; say what is left
            _say(stdout, f"clean-up failed ({type(exc).__name__}: {exc}); cluster bench-ingest-{bench.tag} remains")


class Bench:
    def __init__(self, *, gpus: int, mig: int, stdout):
        self.gpus, self.mig, self.stdout = gpus, mig, stdout
        self.tag = uuidlib.uuid4().hex[:8]
        self.cluster = None
        self.project = None
        self.series_range: tuple[int, int] | None = None
        self.tables_were_empty = False
        self.saved_rollup_state = None

    # --- fleet ---------------------------------------------------------------------------------

    def build(self) -> None:
        profile = MigProfile.objects.get(product="H100-80GB", name="1g.10gb")
        placements = {p.start: p for p in profile.valid_placements.all()}
        self.cluster = Cluster.objects.create(name=f"bench-ingest-{self.tag}", kubeconfig_path="/dev/null")
        nodes = NodeCapacity.objects.bulk_create(
            [
                NodeCapacity(cluster=self.cluster, name=f"node-{i:05d}", gpu_count=PER_NODE)
                for i in range((self.gpus + PER_NODE - 1) // PER_NODE)
            ],
            batch_size=5000,
        )
        mig_gpus = (self.mig + 6) // 7
        gpu_rows = GpuCapacity.objects.bulk_create(
            [
                GpuCapacity(
                    node=nodes[i // PER_NODE],
                    index=i % PER_NODE,
                    uuid=f"GPU-bench-{self.tag}-{i:06d}",
                    product="NVIDIA H100 80GB HBM3",
                    catalog_product="H100-80GB",
                    memory_mib=81559,
                    mig_mode_current=i < mig_gpus,
                )
                for i in range(self.gpus)
            ],
            batch_size=5000,
        )
        instances = []
        for n in range(self.mig):
            gpu, start = gpu_rows[n // 7], n % 7
            instances.append(
                MigInstance(
                    gpu=gpu,
                    profile=profile,
                    placement=placements[start],
                    placement_start=start,
                    placement_size=1,
                    gi_id=7 + start,
                    ci_id=0,
                    uuid=f"MIG-bench-{self.tag}-{n:06d}",
                )
            )
        instances = MigInstance.objects.bulk_create(instances, batch_size=5000)
        Series.objects.bulk_create(
            [Series(gpu=g, mem_total_mib=81559) for g in gpu_rows]
            + [Series(gpu_id=m.gpu_id, mig_instance=m, mem_total_mib=9984) for m in instances],
            batch_size=5000,
        )
        rows = Series.objects.filter(gpu__node__cluster=self.cluster)
        self.gpu_series = list(rows.filter(mig_instance__isnull=True).order_by("id").values_list("id", "gpu_id"))
        self.mig_series = list(
            rows.filter(mig_instance__isnull=False).order_by("id").values_list("id", "mig_instance_id")
        )
        ids = [s for s, _ in self.gpu_series] + [s for s, _ in self.mig_series]
        self.series_range = (min(ids), max(ids))
        self.mig_gpu_ids = {g.pk for g in gpu_rows[:mig_gpus]}

    # --- rows ----------------------------------------------------------------------------------

    def poll(self, p: int, ts: datetime) -> list[tuple]:
        """One poll of the whole fleet, in series order, as node agents would hand it over."""
        rows = []
        for k, (sid, gpu_id) in enumerate(self.gpu_series):
            load = (k * 37 + p * 11) % 100
            rows.append(
                (
                    ts,
                    10_000_000 + p * 9_000_000 + k,
                    sid,
                    70.0 + 6.3 * load,
                    float(load),
                    1024 + 700 * load,
                    0,
                    0,
                    3,
                    0,
                    1 if load < 5 else 0,
                    None if gpu_id in self.mig_gpu_ids else load,
                    30 + load // 3,
                    None,
                    0,
                    0,
                    0,
                    False,
                    False,
                )
            )
        for k, (sid, _) in enumerate(self.mig_series):
            load = (k * 53 + p * 7) % 100
            rows.append((ts, None, sid, None, float(load), 500 + 90 * load, *([None] * 13)))
        return rows

    # --- the run -------------------------------------------------------------------------------

    def run(self, *, minutes: int, query_series: int) -> dict:
        self.tables_were_empty = not any(m.objects.exists() for m in (Sample, Rollup5m, Rollup1h))
        started = time.monotonic()
        self.build()
        setup_s = time.monotonic() - started
        series = len(self.gpu_series) + len(self.mig_series)
        _say(self.stdout, f"fleet of {series} series built in {setup_s:.1f} s")

        hour = datetime.fromtimestamp(int(timezone.now().timestamp()) // 3600 * 3600, tz=UTC) - timedelta(hours=3)
        polls = max(1, minutes * 60 // INTERVAL_S)
        # Ingest and the COPY floor alternate batch by batch (and which goes first), so both see the
        # same load on a shared machine.
        ingest_s, floor_s, samples = 0.0, 0.0, 0
        with self.floor_table() as floor_copy:
            for p in range(polls):
                rows = self.poll(p, hour + timedelta(seconds=INTERVAL_S * p))
                for step in ("ingest", "floor") if p % 2 == 0 else ("floor", "ingest"):
                    t0 = time.perf_counter()
                    if step == "ingest":
                        ingest_samples(rows)
                        ingest_s += time.perf_counter() - t0
                    else:
                        floor_copy(rows)
                        floor_s += time.perf_counter() - t0
                samples += len(rows)
        _say(self.stdout, f"ingested {samples} samples in {ingest_s:.2f} s; raw COPY floor {floor_s:.2f} s")
        low, high = self.series_range
        stored = Sample.objects.filter(series__gte=low, series__lte=high).count()
        size = self.sizes()

        # The prescribed conflict-tolerant path on its own (two poll cycles), for comparison.
        staging_s, staging_n = 0.0, 0
        for p in range(polls, polls + 2):
            rows = self.poll(p, hour + timedelta(seconds=INTERVAL_S * p))
            t0 = time.perf_counter()
            ingest_samples(rows, optimistic=False)
            staging_s += time.perf_counter() - t0
            staging_n += len(rows)
        # Node agents: one small transaction per node (8 GPUs and their MIG instances).
        p = polls + 2
        rows = self.poll(p, hour + timedelta(seconds=INTERVAL_S * p))
        gpu_of_series = {sid: gpu_id for sid, gpu_id in self.gpu_series} | self._mig_gpu_of()
        node_of_gpu = self._gpu_node()
        batches: dict[int, list] = {}
        for row in rows:
            batches.setdefault(node_of_gpu[gpu_of_series[row[2]]], []).append(row)
        node_batches = list(batches.values())[:300]
        node_n = sum(len(b) for b in node_batches)
        t0 = time.perf_counter()
        for batch in node_batches:
            ingest_samples(batch)
        node_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        rollup_5m(hour, hour + timedelta(hours=1))
        rollup_1h(hour, hour + timedelta(hours=1))
        rollup_s = time.perf_counter() - t0
        rolled = Sample.objects.filter(ts__gte=hour, ts__lt=hour + timedelta(hours=1)).count()
        _say(self.stdout, f"rolled up {rolled} samples in {rollup_s:.2f} s")

        query = self.pool_query(query_series, hour - timedelta(days=2))
        return {
            "samples": samples,
            "stored": stored,
            "series": series,
            "ingest_samples_per_s": round(samples / ingest_s),
            "copy_floor_samples_per_s": round(samples / floor_s),
            "ratio": round(floor_s / ingest_s, 3),
            "bytes_per_sample": size["total"],
            "heap_bytes_per_sample": size["heap"],
            "index_bytes_per_sample": size["index"],
            "rollup_hour_s": round(rollup_s, 3),
            "rollup_samples": rolled,
            **query,
            "staging_ingest_samples_per_s": round(staging_n / staging_s),
            "node_batch_samples_per_s": round(node_n / node_s),
            "node_batch_rows": round(node_n / len(node_batches)),
            "setup_s": round(setup_s, 1),
            "tables_were_empty": self.tables_were_empty,
        }

    def _mig_gpu_of(self) -> dict[int, int]:
        gpu_of = dict(MigInstance.objects.filter(gpu__node__cluster=self.cluster).values_list("id", "gpu_id"))
        return {sid: gpu_of[mig_id] for sid, mig_id in self.mig_series}

    def _gpu_node(self) -> dict[int, int]:
        return dict(GpuCapacity.objects.filter(node__cluster=self.cluster).values_list("id", "node_id"))

    def sizes(self) -> dict:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_total_relation_size('monitoring_sample'), pg_relation_size('monitoring_sample'), "
                "pg_indexes_size('monitoring_sample'), (SELECT count(*) FROM monitoring_sample)"
            )
            total, heap, index, rows = cursor.fetchone()
        return {"total": round(total / rows, 1), "heap": round(heap / rows, 1), "index": round(index / rows, 1)}

    @contextmanager
    def floor_table(self):
        """An unindexed copy of the sample table; yields `copy(rows)`: one raw binary COPY per call."""

        table = f"bench_copy_floor_{self.tag}"
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE TABLE {table} (LIKE monitoring_sample)")

        def copy(rows):
            with transaction.atomic(), connection.cursor() as cursor:
                with cursor.copy(f"COPY {table} ({', '.join(SAMPLE_COLUMNS)}) FROM STDIN (FORMAT BINARY)") as cp:
                    cp.set_types(SAMPLE_PG_TYPES)
                    for row in rows:
                        cp.write_row(row)

        try:
            yield copy
        finally:
            with connection.cursor() as cursor:
                cursor.execute(f"DROP TABLE IF EXISTS {table}")

    def pool_query(self, n_series: int, start: datetime) -> dict:
        """24 h of raw samples for n MIG series, their rollups, then one pool of 8 of them read at 5 m."""

        chosen = self.mig_series[:n_series]
        end = start + timedelta(hours=24)
        fill_s, filled, rows = 0.0, 0, []
        polls = 24 * 3600 // INTERVAL_S
        for p in range(polls):
            ts = start + timedelta(seconds=INTERVAL_S * p)
            rows += [
                (ts, None, sid, None, float((k * 53 + p * 7) % 100), 500 + k % 9000, *([None] * 13))
                for k, (sid, _) in enumerate(chosen)
            ]
            if len(rows) >= 50_000 or p == polls - 1:  # a backfill: large batches
                t0 = time.perf_counter()
                ingest_samples(rows)
                fill_s += time.perf_counter() - t0
                filled += len(rows)
                rows = []
        _say(self.stdout, f"24 h for {n_series} series: {filled} samples in {fill_s:.1f} s")
        t0 = time.perf_counter()
        rollup_5m(start, end)
        rollup_24h_s = time.perf_counter() - t0

        self.project = Project.objects.create(
            name=f"bench {self.tag}", slug=f"bench-{self.tag}", namespace=f"bench-{self.tag}"
        )
        request = PoolRequest.objects.create(project=self.project, cluster=self.cluster, name="bench")
        pool = GpuPool.objects.create(
            project=self.project, request=request, cluster=self.cluster, name="bench", workload_type="inference"
        )
        for _, mig_id in chosen[:8]:
            instance = MigInstance.objects.select_related("profile").get(pk=mig_id)
            Allocation.objects.create(
                pool=pool,
                project=self.project,
                kind="mig",
                gpu_id=instance.gpu_id,
                mig_instance=instance,
                resource_name=instance.profile.resource_name,
                product="H100-80GB",
                profile_name=instance.profile.name,
                compute_slices=1,
                allocated_at=start - timedelta(days=1),
            )
        state = RollupRun.objects.filter(level=RollupLevel.FIVE_MINUTES).first()
        self.saved_rollup_state = (state is not None, state.complete_until if state else None)
        RollupRun.objects.update_or_create(level=RollupLevel.FIVE_MINUTES, defaults={"complete_until": end})

        def timed() -> tuple[float, dict]:
            t0 = time.perf_counter()
            data = readers.pool_utilisation(pool, start, end, step="5m")
            return (time.perf_counter() - t0) * 1000, data

        cold_ms, data = timed()
        warm = [timed()[0] for _ in range(5)]
        # The price of the (ts, series_id) key: one series' raw samples, 2 h (the API's auto step).
        series_raw = []
        for _ in range(5):
            t0 = time.perf_counter()
            points = readers.series_points([chosen[0][0]], end - timedelta(hours=2), end, step="raw")
            series_raw.append((time.perf_counter() - t0) * 1000)
        assert len(points[chosen[0][0]]) == 240, len(points[chosen[0][0]])
        RollupRun.objects.filter(level=RollupLevel.FIVE_MINUTES).update(complete_until=None)
        raw = [timed()[0] for _ in range(3)]
        _, raw_data = timed()
        assert len(data["points"]) == 288 and len(raw_data["points"]) == 288, (
            len(data["points"]),
            len(raw_data["points"]),
        )
        return {
            "pool_24h_query_ms": round(statistics.median(warm), 1),
            "pool_24h_query_cold_ms": round(cold_ms, 1),
            "pool_24h_raw_query_ms": round(statistics.median(raw), 1),
            "series_2h_raw_query_ms": round(statistics.median(series_raw), 1),
            "pool_24h_points": len(data["points"]),
            "query_table_samples": Sample.objects.count(),
            "query_fill_samples_per_s": round(filled / fill_s),
            "rollup_24h_query_series_s": round(rollup_24h_s, 2),
        }

    # --- clean-up ------------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Remove everything the run created, with plain SQL (no ORM cascade through other apps' tables)."""

        if self.saved_rollup_state is not None:
            existed, until = self.saved_rollup_state
            if existed:
                RollupRun.objects.filter(level=RollupLevel.FIVE_MINUTES).update(complete_until=until)
            else:
                RollupRun.objects.filter(level=RollupLevel.FIVE_MINUTES).delete()
        with transaction.atomic(), connection.cursor() as cursor:
            if self.project is not None:
                for table in ("pools_allocation", "pools_gpupool", "pools_poolrequest"):
                    cursor.execute(f"DELETE FROM {table} WHERE project_id = %s", [self.project.pk])
                cursor.execute("DELETE FROM pools_project WHERE id = %s", [self.project.pk])
            if self.series_range is not None:
                tables = ["monitoring_sample", "monitoring_rollup5m", "monitoring_rollup1h"]
                if self.tables_were_empty:
                    cursor.execute(f"TRUNCATE {', '.join(tables)}")
                else:
                    for table in tables:
                        cursor.execute(f"DELETE FROM {table} WHERE series_id BETWEEN %s AND %s", self.series_range)
            if self.cluster is not None:
                nodes = "SELECT id FROM capacity_nodecapacity WHERE cluster_id = %s"
                gpus = f"SELECT id FROM capacity_gpucapacity WHERE node_id IN ({nodes})"
                cursor.execute(f"DELETE FROM monitoring_series WHERE gpu_id IN ({gpus})", [self.cluster.pk])
                cursor.execute(f"DELETE FROM capacity_miginstance WHERE gpu_id IN ({gpus})", [self.cluster.pk])
                cursor.execute(f"DELETE FROM capacity_gpucapacity WHERE node_id IN ({nodes})", [self.cluster.pk])
                cursor.execute("DELETE FROM capacity_nodecapacity WHERE cluster_id = %s", [self.cluster.pk])
                cursor.execute("DELETE FROM capacity_cluster WHERE id = %s", [self.cluster.pk])

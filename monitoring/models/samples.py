"""Metric samples and their rollups, the rollup and maintenance runs, and the collectors that poll for them.

Storage is shaped for a fleet of tens of thousands of GPUs and MIG instances polled every 30 s:
- `Series` (models/series.py) gives each GPU and each MIG instance a 4-byte id;
- `Sample` is one narrow row per (series, ts), no surrogate key, no foreign-key constraint (the
  ingest path does not pay a referential check per row), 4-byte floats, NULL = unavailable;
- `Rollup5m` / `Rollup1h` hold avg/min/max per series per bucket, upserted idempotently.
See docs/monitoring.md for the byte budget and retention.
"""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.utils import timezone

from ..choices import MetricSource, RollupLevel
from .series import Series


class RealField(models.FloatField):
    """A 4-byte float (PostgreSQL `real`): a gauge needs ~7 significant digits, not 15."""

    def db_type(self, connection):
        return "real"

    def deconstruct(self):
        # The migrations name it where it was defined before models became a package.
        name, _path, args, kwargs = super().deconstruct()
        return name, "monitoring.models.RealField", args, kwargs


class Sample(models.Model):
    """One reading of one series. NULL means "not available on this GPU/source", never zero.

    Column order is the on-disk order: 8-byte columns first, then 4, 2, 1 so PostgreSQL adds no
    alignment padding. A MIG row (ts, series, sm_active, mem_used) is ~60 bytes with its line pointer.
    """

    pk = models.CompositePrimaryKey("ts", "series")
    ts = models.DateTimeField()
    energy_mj = models.BigIntegerField(null=True, help_text="Energy counter since driver load, mJ.")
    series = models.ForeignKey(
        Series, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    power_w = RealField(null=True)
    sm_active = RealField(null=True, help_text="SM activity, percent (GPM SM_UTIL or DCGM PROF_SM_ACTIVE).")
    mem_used_mib = models.IntegerField(null=True)
    ecc_sbe_vol = models.IntegerField(null=True, help_text="Corrected (single-bit) ECC errors, volatile.")
    ecc_dbe_vol = models.IntegerField(null=True, help_text="Uncorrected (double-bit) ECC errors, volatile.")
    ecc_sbe_agg = models.IntegerField(null=True, help_text="Corrected ECC errors, aggregate (lifetime).")
    ecc_dbe_agg = models.IntegerField(null=True, help_text="Uncorrected ECC errors, aggregate (lifetime).")
    throttle = models.IntegerField(null=True, help_text="NVML clocks-event (throttle) reason bitmask.")
    gpu_util = models.SmallIntegerField(null=True, help_text="NVML utilisation.gpu, percent.")
    temp_c = models.SmallIntegerField(null=True)
    retired_pages = models.SmallIntegerField(null=True)
    remap_corr = models.SmallIntegerField(null=True, help_text="Rows remapped for correctable errors.")
    remap_unc = models.SmallIntegerField(null=True, help_text="Rows remapped for uncorrectable errors.")
    xid = models.SmallIntegerField(null=True, help_text="XID seen since the previous sample (0 = none).")
    remap_pending = models.BooleanField(null=True)
    remap_failure = models.BooleanField(null=True)

    class Meta:
        ordering = ["ts", "series_id"]  # the key order; "series" would join the series table
        # The key leads with ts: a poll's rows append at the index's right edge (ingest speed), and
        # the key serves time-range scans. Reads of a few series go through readers.samples_between.

    def __str__(self) -> str:
        return f"series {self.series_id} @ {self.ts:%Y-%m-%d %H:%M:%S}"


# The metric columns of Sample as the ingest path writes them, in table order.
SAMPLE_COLUMNS: tuple[str, ...] = (
    "ts",
    "energy_mj",
    "series_id",
    "power_w",
    "sm_active",
    "mem_used_mib",
    "ecc_sbe_vol",
    "ecc_dbe_vol",
    "ecc_sbe_agg",
    "ecc_dbe_agg",
    "throttle",
    "gpu_util",
    "temp_c",
    "retired_pages",
    "remap_corr",
    "remap_unc",
    "xid",
    "remap_pending",
    "remap_failure",
)
# PostgreSQL types of those columns, for binary COPY.
SAMPLE_PG_TYPES: tuple[str, ...] = (
    "timestamptz",
    "int8",
    "int4",
    "float4",
    "float4",
    "int4",
    "int4",
    "int4",
    "int4",
    "int4",
    "int4",
    "int2",
    "int2",
    "int2",
    "int2",
    "int2",
    "int2",
    "bool",
    "bool",
)


class Rollup(models.Model):
    """avg/min/max of the gauges of one series over one bucket; `samples` weighs the averages."""

    series = models.ForeignKey(
        Series, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    bucket = models.DateTimeField()
    samples = models.IntegerField()
    power_w_avg = RealField(null=True)
    power_w_min = RealField(null=True)
    power_w_max = RealField(null=True)
    sm_active_avg = RealField(null=True)
    sm_active_min = RealField(null=True)
    sm_active_max = RealField(null=True)
    gpu_util_avg = RealField(null=True)
    gpu_util_min = RealField(null=True)
    gpu_util_max = RealField(null=True)
    mem_used_mib_avg = RealField(null=True)
    mem_used_mib_min = models.IntegerField(null=True)
    mem_used_mib_max = models.IntegerField(null=True)
    temp_c_avg = RealField(null=True)
    temp_c_min = models.SmallIntegerField(null=True)
    temp_c_max = models.SmallIntegerField(null=True)
    energy_mj_min = models.BigIntegerField(null=True)
    energy_mj_max = models.BigIntegerField(null=True)

    class Meta:
        abstract = True
        ordering = ["series", "bucket"]

    def __str__(self) -> str:
        return f"series {self.series_id} @ {self.bucket:%Y-%m-%d %H:%M}"


class Rollup5m(Rollup):
    pk = models.CompositePrimaryKey("series", "bucket")

    class Meta(Rollup.Meta):
        verbose_name = "5-minute rollup"


class Rollup1h(Rollup):
    pk = models.CompositePrimaryKey("series", "bucket")

    class Meta(Rollup.Meta):
        verbose_name = "hourly rollup"


class RollupRun(models.Model):
    """Progress of the rollup job per level: buckets before `complete_until` are final (readers trust them)."""

    level = models.CharField(max_length=4, choices=RollupLevel, primary_key=True)
    complete_until = models.DateTimeField(null=True, blank=True)
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_finished_at = models.DateTimeField(null=True, blank=True)
    last_duration_s = models.FloatField(null=True, blank=True)
    last_rows = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["level"]

    def __str__(self) -> str:
        return f"{self.level} rollups complete until {self.complete_until}"

    @classmethod
    def finished_until(cls, level: str) -> datetime | None:
        """Buckets of `level` before this time are final; None before the first run."""
        return cls.objects.filter(level=level).values_list("complete_until", flat=True).first()


class MaintenanceRun(models.Model):
    """One run of a periodic monitoring job (rollup, retention, idle scan): status, timing, counts, error."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"

    job = models.CharField(max_length=32)
    status = models.CharField(max_length=16, choices=Status, default=Status.RUNNING)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    task_id = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["job", "-started_at"], name="monitoring_maint_job_recent")]

    def __str__(self) -> str:
        return f"{self.job} @ {self.started_at:%Y-%m-%d %H:%M:%S} ({self.status})"


class Collector(models.Model):
    """One metrics source and how its last collection went: a node agent (NVML) or a DCGM exporter URL."""

    cluster = models.ForeignKey("capacity.Cluster", on_delete=models.CASCADE, related_name="metric_collectors")
    node = models.ForeignKey(
        "capacity.NodeCapacity", null=True, blank=True, on_delete=models.CASCADE, related_name="metric_collectors"
    )
    source = models.CharField(max_length=8, choices=MetricSource)
    target = models.CharField(max_length=500, help_text="Node name (NVML) or exporter URL (DCGM).")
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_samples = models.PositiveIntegerField(default=0)
    last_duration_ms = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    late_dropped_samples = models.PositiveBigIntegerField(
        default=0,
        help_text="Samples of this node's reports that arrived past MONITORING_ROLLUP_LATENESS_S and were dropped"
        " (cumulative).",
    )

    class Meta:
        ordering = ["cluster_id", "source", "target"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "source", "target"], name="monitoring_collector_unique_cluster_source_target"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_source_display()} {self.target}"

    @property
    def ok(self) -> bool:
        return not self.last_error

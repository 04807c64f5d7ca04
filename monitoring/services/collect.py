"""Collection: node agents read NVML, DCGM exporters are scraped; both become the same sample rows.

One source per cluster: a cluster with `dcgm_exporter_url` is scraped (its exporter is the agent),
every other cluster is polled node by node through NVML: the node's agent reads and signs
(capacity/agent/, read_node_metrics_task on node.<cluster>.<node>) and the control plane's ingest
worker writes many nodes' reports at once (services/reports.py, which uses `map_nvml` here). Either
way a poll:
1. maps readings to our rows (GPU by UUID, MIG instance by UUID or by parent GPU + GI id);
2. writes one sample per GPU and per MIG instance at the poll's slot time (insert-or-ignore, so a
   retried poll writes nothing twice);
3. evaluates the health rules (monitoring/health.py) on every GPU and MIG instance;
4. checks time-sliced GPUs for pods far above their memory share (services/timeslice.py);
5. records how it went on the Collector row (admin: "Metric collectors").

Readings NVML or DCGM do not give (NotSupported, not exported) are NULL, never zero.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from capacity.adapters import nvml
from capacity.choices import MigInstanceState
from capacity.mig.catalog import find_product
from capacity.models import Cluster, GpuCapacity, MigInstance, NodeCapacity, WorkloadProfile
from capacity.services import workloads
from monitoring import health as rules
from monitoring.adapters import prometheus
from monitoring.choices import MetricSource
from monitoring.ingest import dcgm
from monitoring.models import Collector, Series

from .health import HealthOutcome, UnitHealth, apply_health
from .idle_memory import learn_idle_memory
from .ingest import ingest_samples, sample_row, series_rows, slot

logger = logging.getLogger(__name__)

GPU_COLUMNS = (
    "power_w",
    "energy_mj",
    "temp_c",
    "mem_used_mib",
    "gpu_util",
    "sm_active",
    "ecc_sbe_vol",
    "ecc_dbe_vol",
    "ecc_sbe_agg",
    "ecc_dbe_agg",
    "retired_pages",
    "remap_corr",
    "remap_unc",
    "remap_pending",
    "remap_failure",
    "throttle",
    "xid",
)


@dataclass(slots=True)
class UnitSample:
    """One unit's values for one poll, before it has a series id."""

    gpu_id: int
    mig_instance_id: int | None
    values: dict
    mem_total_mib: int | None = None
    # (product, MIG profile or "" for a whole GPU) when NVML listed no process on the unit this poll: its memory
    # in use is then the driver's own reservation (services/idle_memory.py learns it).
    idle_kind: tuple[str, str] | None = None
    # A vGPU of a vm-vgpu host (its mdev UUID and type) and the running VM workload holding it (None: no VM known).
    vgpu_uuid: str = ""
    vgpu_type: str = ""
    vgpu_workload_id: int | None = None

    @property
    def unit(self) -> tuple:
        """The series key: (gpu, MIG instance) or (gpu, None, vGPU mdev UUID)."""
        return (
            (self.gpu_id, self.mig_instance_id, self.vgpu_uuid)
            if self.vgpu_uuid
            else (self.gpu_id, self.mig_instance_id)
        )


@dataclass(slots=True)
class CollectResult:
    samples: int = 0
    gpus: int = 0
    mig_instances: int = 0
    vgpus: int = 0
    lost: int = 0
    unknown: list[str] = field(default_factory=list)
    error: str = ""
    health: HealthOutcome = field(default_factory=HealthOutcome)
    share_violations: int = 0

    def summary(self) -> dict:
        return {
            "samples": self.samples,
            "gpus": self.gpus,
            "mig_instances": self.mig_instances,
            "vgpus": self.vgpus,
            "lost": self.lost,
            "unknown": self.unknown[:20],
            "error": self.error,
            "events_opened": len(self.health.opened),
            "events_resolved": len(self.health.resolved),
            "share_violations": self.share_violations,
        }


def poll_slot(at: datetime | None = None) -> datetime:
    """The sample time of a poll: now floored to METRICS_INTERVAL_S."""
    return slot(at or timezone.now(), settings.METRICS_INTERVAL_S)


# --- NVML (node agents) ---------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class GpuRow:
    """The columns of a present GPU that mapping a poll reads (GpuCapacity's names; no model instance)."""

    pk: int
    node_id: int
    index: int
    uuid: str
    product: str
    catalog_product: str
    memory_mib: int | None


@dataclass(slots=True, frozen=True)
class MigRow:
    """The columns of an active MIG instance that mapping a poll reads (compute slices: its profile's)."""

    pk: int
    gpu_id: int
    gi_id: int | None
    uuid: str
    compute_slices: int
    profile_name: str = ""


@dataclass(slots=True)
class NodeReading:
    """One node's NVML poll mapped to our rows, not yet written."""

    node: NodeCapacity
    samples: list[UnitSample] = field(default_factory=list)
    health: list[UnitHealth] = field(default_factory=list)
    shared: list[tuple[GpuRow, nvml.GpuMetrics]] = field(default_factory=list)
    result: CollectResult = field(default_factory=CollectResult)


def map_nvml(
    node: NodeCapacity,
    readings: list[nvml.GpuMetrics],
    gpus: list[GpuRow],
    instances: list[MigRow],
    vms: dict[str, int] | None = None,
) -> NodeReading:
    """Map one NVML poll of `node` to sample and health rows: GPUs by UUID (else index), MIG instances by
    UUID (else parent GPU + GI id), a vm-vgpu host's vGPUs by their mdev UUID on their GPU. `gpus`: the node's
    present GPUs; `instances`: their active MIG instances; `vms`: mdev UUID -> the running VM workload holding
    it (vgpu_workloads). Reads nothing from the database."""
    out = NodeReading(node)
    result = out.result
    by_uuid = {g.uuid: g for g in gpus}
    by_index = {g.index: g for g in gpus}
    mig_by_uuid = {m.uuid: m for m in instances}
    mig_by_gi = {(m.gpu_id, m.gi_id): m for m in instances if m.gi_id is not None}
    for r in readings:
        gpu = by_uuid.get(r.uuid) if r.uuid else by_index.get(r.index)
        if gpu is None:
            result.unknown.append(r.uuid or f"{node.name}#{r.index}")
            continue
        if r.lost:
            result.lost += 1
            out.health.append(UnitHealth(gpu.pk, None, rules.Reading(lost=True, xids=_codes(r.xids, None))))
            continue
        result.gpus += 1
        values = {name: getattr(r, attr) for name, attr in _NVML_GPU_FIELDS}
        gpu_xids = _codes(r.xids, None)
        values["xid"] = _xid_column(gpu_xids)
        unit_slices: list[tuple[float | None, int]] = []
        for m in r.mig:
            instance = mig_by_uuid.get(m.uuid) or mig_by_gi.get((gpu.pk, m.gpu_instance_id))
            if instance is None:
                result.unknown.append(m.uuid)
                continue
            result.mig_instances += 1
            mig_xids = _codes(r.xids, m.gpu_instance_id)
            out.samples.append(
                UnitSample(
                    gpu.pk,
                    instance.pk,
                    {"sm_active": m.sm_active, "mem_used_mib": m.memory_used_mib, "xid": _xid_column(mig_xids) or None},
                    m.memory_total_mib,
                    None if m.processes else (gpu.catalog_product or gpu.product, instance.profile_name),
                )
            )
            out.health.append(UnitHealth(gpu.pk, instance.pk, rules.Reading(xids=mig_xids)))
            unit_slices.append((m.sm_active, instance.compute_slices))
        if values["sm_active"] is None and r.mig_enabled:
            values["sm_active"] = _derived_sm_active(gpu, unit_slices, expected=len(r.mig))
        for v in r.vgpus:
            if not v.mdev_uuid:
                continue
            result.vgpus += 1
            out.samples.append(_vgpu_sample(gpu.pk, v, (vms or {}).get(v.mdev_uuid)))
        idle = not r.mig_enabled and not r.processes
        kind = (gpu.catalog_product or gpu.product, "") if idle else None
        out.samples.append(UnitSample(gpu.pk, None, values, r.memory_total_mib, kind))
        out.health.append(
            UnitHealth(
                gpu.pk,
                None,
                rules.Reading(
                    ecc_dbe_vol=r.ecc_dbe_vol,
                    remap_pending=r.remap_pending,
                    remap_failure=r.remap_failure,
                    throttle=r.throttle,
                    xids=gpu_xids,
                ),
            )
        )
        if not r.mig_enabled and node.timeslice_replicas > 1:
            out.shared.append((gpu, r))
    return out


def _vgpu_sample(gpu_id: int, v: nvml.VgpuMetrics, workload_id: int | None) -> UnitSample:
    """A vGPU's sample: NVML's per-vGPU SM utilisation in gpu_util (the share of time a kernel ran on the vGPU,
    like utilisation.gpu; GPM SM activity is not offered per vGPU), framebuffer in use in mem_used_mib, the type's
    framebuffer as the series' memory total. Memory, encoder and decoder utilisation are not stored (no columns)."""
    return UnitSample(
        gpu_id,
        None,
        {"gpu_util": v.sm_util_pct, "mem_used_mib": v.fb_used_mib},
        v.fb_total_mib,
        vgpu_uuid=v.mdev_uuid[:64],
        vgpu_type=v.vgpu_type[:32],
        vgpu_workload_id=workload_id,
    )


def vgpu_workloads(node_ids: list[int]) -> dict[int, dict[str, int]]:
    """node id -> {device id (a vGPU's mdev UUID): the running VM workload holding it}: the virt-launcher pods
    discovery attributed (WorkloadProfile.vmi_name, device_ids from the kubelet's PodResources). One query."""
    found: dict[int, dict[str, int]] = defaultdict(dict)
    rows = (
        WorkloadProfile.objects.running()
        .filter(node_id__in=sorted(node_ids))
        .exclude(vmi_name="")
        .values_list("node_id", "pk", "device_ids")
    )
    for node_id, pk, ids in rows.order_by("pk"):
        for device_id in ids or ():
            found[node_id][device_id] = pk
    return found


_NVML_GPU_FIELDS = (
    ("power_w", "power_w"),
    ("energy_mj", "energy_mj"),
    ("temp_c", "temperature_c"),
    ("mem_used_mib", "memory_used_mib"),
    ("gpu_util", "gpu_util"),
    ("sm_active", "sm_active"),
    ("ecc_sbe_vol", "ecc_sbe_vol"),
    ("ecc_dbe_vol", "ecc_dbe_vol"),
    ("ecc_sbe_agg", "ecc_sbe_agg"),
    ("ecc_dbe_agg", "ecc_dbe_agg"),
    ("retired_pages", "retired_pages"),
    ("remap_corr", "remap_corr"),
    ("remap_unc", "remap_unc"),
    ("remap_pending", "remap_pending"),
    ("remap_failure", "remap_failure"),
    ("throttle", "throttle"),
)


def _codes(xids: list[nvml.XidEvent] | None, gi_id: int | None) -> list[int] | None:
    """XID codes of the GPU itself (gi_id None) or of one GPU instance; None when XIDs are unavailable."""
    if xids is None:
        return None
    return [x.code for x in xids if x.gpu_instance_id == gi_id]


def _xid_column(codes: list[int] | None) -> int | None:
    """What the sample's xid column keeps: the most severe code seen this poll, 0 for none."""
    if codes is None:
        return None
    if not codes:
        return 0
    critical = [c for c in codes if c in settings.MONITORING_XID_CRITICAL]
    return (critical or codes)[-1]


def _derived_sm_active(gpu: GpuCapacity | GpuRow, units: list[tuple[float | None, int]], expected: int) -> float | None:
    """SM activity of a MIG-enabled GPU from its instances, weighted by compute slices (free slices idle).

    Only when all `expected` instances have a value: a partial picture would under-report the GPU.
    """
    product = find_product(gpu.catalog_product or gpu.product)
    if product is None or not units or len(units) != expected or any(value is None for value, _ in units):
        return None
    return sum(value * slices for value, slices in units) / product.compute_slices


def write_samples(samples: list[UnitSample], *, ts: datetime, source: str) -> int:
    """Series ids, one bulk insert-or-ignore, memory totals kept on the series; rows offered."""
    if not samples:
        return 0
    series = series_rows(s.unit for s in samples)
    rows = [sample_row(series[s.unit][0], ts, s.values) for s in samples]
    rows.sort(key=lambda row: row[2])  # series_id order: index inserts walk the btree once
    ingest_samples(rows)
    _update_series(series, samples, source)
    _update_vgpu_series(series, [s for s in samples if s.vgpu_uuid])
    learn_idle_memory(samples, at=ts)
    return len(rows)


def _update_series(series: dict, samples: list[UnitSample], source: str) -> None:
    """Keep each series' memory total and source in step: one UPDATE per distinct (total, source) pair.

    `series`: (id, mem_total_mib, source) per unit as read before this poll's insert. A fleet has few distinct
    memory totals, so a first poll of thousands of new series costs a handful of statements (a
    bulk_update's CASE over every row took seconds at 2,000 nodes); a steady poll costs none.
    """
    stale: dict[tuple[int | None, str], list[int]] = defaultdict(list)
    for s in samples:
        pk, total, was = series[s.unit]
        if (s.mem_total_mib is not None and s.mem_total_mib != total) or was != source:
            stale[(s.mem_total_mib if s.mem_total_mib is not None else total, source)].append(pk)
    for (total, new_source), pks in sorted(stale.items(), key=lambda item: (item[0][0] or 0, item[0][1])):
        Series.objects.filter(pk__in=sorted(pks)).update(mem_total_mib=total, source=new_source)


def _update_vgpu_series(series: dict, samples: list[UnitSample]) -> None:
    """Keep each vGPU series' type and VM workload in step: one read, one UPDATE per distinct (type, workload)
    pair that changed (a VM started or stopped on the vGPU); none in a steady poll."""
    if not samples:
        return
    ids = {series[s.unit][0]: s for s in samples}
    stale: dict[tuple[str, int | None], list[int]] = defaultdict(list)
    for pk, vgpu_type, workload_id in Series.objects.filter(pk__in=sorted(ids)).values_list(
        "pk", "vgpu_type", "vgpu_workload_id"
    ):
        s = ids[pk]
        if (vgpu_type, workload_id) != (s.vgpu_type, s.vgpu_workload_id):
            stale[(s.vgpu_type, s.vgpu_workload_id)].append(pk)
    for (vgpu_type, workload_id), pks in sorted(stale.items(), key=lambda item: (item[0][0], item[0][1] or 0)):
        Series.objects.filter(pk__in=sorted(pks)).update(vgpu_type=vgpu_type, vgpu_workload_id=workload_id)


def _record_collector(
    cluster: Cluster, node: NodeCapacity | None, source: str, target: str, result: CollectResult, started: float
) -> None:
    now = timezone.now()
    values = {
        "node": node,
        "last_attempt_at": now,
        "last_samples": result.samples,
        "last_duration_ms": int((time.monotonic() - started) * 1000),
        "last_error": result.error[:2000],
    }
    if not result.error:
        values["last_success_at"] = now
    Collector.objects.update_or_create(cluster=cluster, source=source, target=target[:500], defaults=values)


# --- DCGM exporter --------------------------------------------------------------------------------


def exporter_urls(cluster: Cluster) -> list[str]:
    return [url.strip() for url in cluster.dcgm_exporter_url.split(",") if url.strip()]


def scrape_cluster(cluster_id: int, *, at: datetime | None = None, fetch=prometheus.fetch) -> CollectResult | None:
    """Scrape every DCGM exporter URL of a cluster and record the readings. None if the cluster is gone."""
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None or not cluster.dcgm_exporter_url:
        return None
    ts = poll_slot(at)
    units: list[dcgm.DcgmUnit] = []
    errors = []
    for url in exporter_urls(cluster):
        started = time.monotonic()
        try:
            samples = prometheus.parse(fetch(url, timeout_s=settings.MONITORING_DCGM_TIMEOUT_S))
        except prometheus.ScrapeError as exc:
            errors.append(str(exc))
            _record_collector(cluster, None, MetricSource.DCGM, url, CollectResult(error=str(exc)), started)
            continue
        found = dcgm.readings(samples)
        units.extend(found)
        _record_collector(cluster, None, MetricSource.DCGM, url, CollectResult(samples=len(found)), started)
    result = record_dcgm(cluster, units, ts=ts)
    result.error = "; ".join(errors)
    return result


def record_dcgm(cluster: Cluster, units: list[dcgm.DcgmUnit], *, ts: datetime) -> CollectResult:
    """Write one scrape of a cluster's exporters: samples and health, like an NVML poll."""
    result = CollectResult()
    uuids = {u.gpu_uuid for u in units}
    gpus = {
        g.uuid: g
        for g in GpuCapacity.objects.filter(uuid__in=uuids, node__cluster=cluster, lost_at__isnull=True).select_related(
            "node"
        )
    }
    instances = {
        (m.gpu_id, m.gi_id): m
        for m in MigInstance.objects.filter(gpu__in=gpus.values(), state=MigInstanceState.ACTIVE).select_related(
            "profile"
        )
    }
    samples: list[UnitSample] = []
    health: list[UnitHealth] = []
    gpu_units: dict[int, UnitSample] = {}
    slices: dict[int, list[tuple[float | None, int]]] = {}
    for unit in units:
        gpu = gpus.get(unit.gpu_uuid)
        if gpu is None:
            result.unknown.append(unit.gpu_uuid)
            continue
        values = dict(unit.values)
        xid = values.get("xid")
        reading = rules.Reading(
            ecc_dbe_vol=values.get("ecc_dbe_vol"),
            remap_failure=values.get("remap_failure"),
            throttle=values.get("throttle"),
            xids=None if xid is None else ([xid] if xid else []),
        )
        if unit.gi_id is None:
            result.gpus += 1
            sample = UnitSample(gpu.pk, None, {k: v for k, v in values.items() if k in GPU_COLUMNS}, unit.mem_total_mib)
            gpu_units[gpu.pk] = sample
            samples.append(sample)
            health.append(UnitHealth(gpu.pk, None, reading))
            continue
        instance = instances.get((gpu.pk, unit.gi_id))
        if instance is None:
            result.unknown.append(f"{unit.gpu_uuid}/GI {unit.gi_id}")
            continue
        result.mig_instances += 1
        mig_values = {k: values[k] for k in ("sm_active", "mem_used_mib") if k in values}
        samples.append(UnitSample(gpu.pk, instance.pk, mig_values, instance.profile.memory_mib))
        slices.setdefault(gpu.pk, []).append((values.get("sm_active"), instance.profile.compute_slices))
        health.append(UnitHealth(gpu.pk, instance.pk, rules.Reading(xids=reading.xids)))
    per_gpu = Counter(gpu_id for gpu_id, _ in instances)
    for gpu_id, sample in gpu_units.items():
        if sample.values.get("sm_active") is None and gpu_id in slices:
            gpu = next(g for g in gpus.values() if g.pk == gpu_id)
            sample.values["sm_active"] = _derived_sm_active(gpu, slices[gpu_id], expected=per_gpu[gpu_id])
    labelled: dict[tuple[str, str], list[str]] = defaultdict(list)
    for unit in units:
        gpu = gpus.get(unit.gpu_uuid)
        instance = None if gpu is None or unit.gi_id is None else instances.get((gpu.pk, unit.gi_id))
        device = instance.uuid if instance is not None else (gpu.uuid if gpu and unit.gi_id is None else "")
        for pod in sorted(unit.pods) if device else ():
            labelled[pod].append(device)
    with transaction.atomic():
        result.samples = write_samples(samples, ts=ts, source=MetricSource.DCGM)
        result.health = apply_health(health, at=ts, source=MetricSource.DCGM)
    if labelled:  # the second source of attribution, after the kubelet's PodResources; the cluster lock first
        with transaction.atomic():
            workloads.attribute_from_exporter(cluster.pk, labelled)
    return result

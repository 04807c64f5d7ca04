"""Trespass: a unit used by someone it does not belong to, checked once per poll on every cluster.

Under the device plugin, quota and node selector bind a project's pods to a count of units on its
nodes, not to its units: the plugin may hand a pod another project's MIG instance. The check compares
the device each running pod really uses (WorkloadProfile: the pod's device ids from the device plugin
or PodResources, else the node agent's NVML process list) with the unit's owner (the project of its
active Allocation; the pod's project comes from its namespace, as provisioning maps them):

- a pod on a unit another project holds: foreign_pod (offending project: the pod's);
- a pod on a unit nobody holds: unallocated_pod;
- no pod, but the unit's samples show real activity over the last MONITORING_TRESPASS_POLLS polls, each of
  them (SM over MONITORING_TRESPASS_SM_PCT, the seed's "over 20% on an unallocated GPU is abnormal", or
  memory in use beyond the driver's own reservation, learned per product and MIG profile from idle units
  (services/idle_memory.py), by more than MONITORING_TRESPASS_MEM_MIB): unallocated_activity (offender
  unknown). One busy sample is no trespass: a poll can catch a driver or health probe.

Each finding opens a TrespassEvent the first poll it is seen, keeps it open while it lasts and ends it
the first poll it is not (one transaction per cluster). With MONITORING_EVICT_TRESPASS the offending pod
is evicted through the Eviction API after commit (evict_trespass_task). Queries per call do not grow
with the fleet: units, allocations, workloads, series and latest samples are one query each.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from capacity.adapters import kubernetes as kube
from capacity.models import Cluster, GpuCapacity, MigInstance, WorkloadProfile
from capacity.services.workloads import physical_id
from policies import policy
from pools.models import Allocation

from .. import signals
from ..choices import TrespassKind
from ..models import Series, TrespassEvent
from ..readers.samples import sample_rows
from .idle_memory import baseline_mib

logger = logging.getLogger(__name__)

Unit = tuple[int, int | None]  # (gpu id, MIG instance id or None)


@dataclass(frozen=True)
class Finding:
    kind: str
    unit: Unit
    owner_project_id: int | None
    project_id: int | None = None
    workload_id: int | None = None
    namespace: str = ""
    pod_name: str = ""
    pod_uid: str = ""
    sm_active: float | None = None
    mem_used_mib: int | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return unit_key(self.unit), self.kind, self.pod_uid


@dataclass
class TrespassResult:
    findings: list[Finding] = field(default_factory=list)
    opened: list[int] = field(default_factory=list)
    ended: int = 0
    evicting: list[int] = field(default_factory=list)

    def summary(self) -> dict:
        return {"open": len(self.findings), "opened": len(self.opened), "ended": self.ended}


def unit_key(unit: Unit) -> str:
    gpu_id, mig_id = unit
    return f"mig:{mig_id}" if mig_id else f"gpu:{gpu_id}"


def owners(cluster: Cluster) -> dict[Unit, set[int]]:
    """Unit -> projects holding it now. A whole GPU or its time-slice replicas are keyed (gpu, None).

    An ending allocation still counts (Allocation.objects.holding()): its project's pods on the unit are being
    evicted by pools.ending within the grace period, not trespassing (docs/pools.md, Ending)."""
    held: dict[Unit, set[int]] = {}
    rows = (
        Allocation.objects.holding()
        .filter(gpu__node__cluster=cluster)
        .values_list("gpu_id", "mig_instance_id", "project_id")
    )
    for gpu_id, mig_id, project_id in rows:
        held.setdefault((gpu_id, mig_id), set()).add(project_id)
    return held


class UnitIndex:
    """The cluster's units by device UUID (two queries): GPUs with MIG off and active MIG instances."""

    def __init__(self, cluster: Cluster):
        gpus = GpuCapacity.objects.present().filter(node__cluster=cluster, lost_at__isnull=True)
        self.gpu_rows = list(gpus.values_list("id", "uuid", "mig_mode_current"))
        self.by_uuid: dict[str, Unit] = {uuid: (pk, None) for pk, uuid, _ in self.gpu_rows}
        self.migs = list(
            MigInstance.objects.active().filter(gpu__node__cluster=cluster).values_list("id", "uuid", "gpu_id")
        )
        self.by_uuid.update({uuid: (gpu_id, pk) for pk, uuid, gpu_id in self.migs if uuid})

    def units(self) -> list[Unit]:
        """The units that can be allocated: every active MIG instance and every GPU with MIG off."""
        return [(gpu_id, pk) for pk, _, gpu_id in self.migs] + [(pk, None) for pk, _, mig in self.gpu_rows if not mig]

    def of_workload(self, device_ids: list[str], gpu_id: int | None, mig_id: int | None) -> list[Unit]:
        """Every unit a pod's devices name; the agent-resolved unit when it names none we know."""
        found = [self.by_uuid[physical_id(d)] for d in device_ids or () if physical_id(d) in self.by_uuid]
        if not found and gpu_id is not None:
            found = [(gpu_id, mig_id)]
        return list(dict.fromkeys(found))


def find(cluster: Cluster, *, at: datetime) -> list[Finding]:
    """What trespasses on `cluster` now (no writes)."""
    index = UnitIndex(cluster)
    held = owners(cluster)
    findings: list[Finding] = []
    occupied: set[Unit] = set()
    workloads = (
        WorkloadProfile.objects.running()
        .filter(cluster=cluster)
        .values_list("id", "project_id", "namespace", "pod_name", "pod_uid", "device_ids", "gpu_id", "mig_instance_id")
        .order_by("id")
    )
    for pk, project_id, namespace, pod_name, pod_uid, ids, gpu_id, mig_id in workloads:
        for unit in index.of_workload(ids, gpu_id, mig_id):
            occupied.add(unit)
            holders = held.get(unit, set())
            if project_id is not None and project_id in holders:
                continue
            kind = TrespassKind.FOREIGN_POD if holders else TrespassKind.UNALLOCATED_POD
            findings.append(
                Finding(
                    kind,
                    unit,
                    min(holders) if holders else None,
                    project_id,
                    pk,
                    namespace,
                    pod_name,
                    pod_uid,
                )
            )
    idle_units = [u for u in index.units() if u not in held and u not in occupied]
    findings.extend(_activity(idle_units, at=at))
    return findings


def _activity(units: list[Unit], *, at: datetime) -> list[Finding]:
    """Unallocated units without a known pod whose last MONITORING_TRESPASS_POLLS samples all show real activity.

    Memory counts beyond the driver's own reservation for the unit's product and profile (learned from idle
    units; 0 where none was learned yet). The newest sample must be of this poll or the last.
    """
    if not units:
        return []
    mig_ids = [m for _, m in units if m]
    gpu_ids = [g for g, m in units if not m]
    series: dict[int, tuple[Unit, tuple[str, str]]] = {}
    wanted = Q(mig_instance_id__in=mig_ids) | Q(gpu_id__in=gpu_ids, mig_instance__isnull=True, vgpu_uuid="")
    rows = Series.objects.filter(wanted).values_list(
        "id", "gpu_id", "mig_instance_id", "gpu__catalog_product", "gpu__product", "mig_instance__profile__name"
    )
    for sid, gpu_id, mig_id, catalog_product, product, profile in rows:
        series[sid] = ((gpu_id, mig_id), (catalog_product or product, profile or ""))
    polls = policy("MONITORING_TRESPASS_POLLS")
    interval = settings.METRICS_INTERVAL_S
    start = at - timedelta(seconds=(polls + 1) * interval)
    recent: dict[int, list[tuple[datetime, float | None, float | None]]] = {}
    for sid, ts, sm, mem in sample_rows(
        sorted(series), start, at + timedelta(seconds=interval), ("sm_active", "mem_used_mib")
    ):
        recent.setdefault(sid, []).append((ts, sm, mem))
    baseline = baseline_mib()
    fresh_after = at - timedelta(seconds=2 * interval)
    found = []
    for sid, samples in sorted(recent.items()):
        last = samples[-polls:]
        if len(samples) < polls or last[-1][0] < fresh_after:
            continue
        unit, kind = series[sid]
        reserved = baseline.get(kind, 0)

        if all(_busy(sm, mem, reserved) for _, sm, mem in last):
            _, sm, mem = last[-1]
            found.append(
                Finding(
                    TrespassKind.UNALLOCATED_ACTIVITY,
                    unit,
                    None,
                    sm_active=sm,
                    mem_used_mib=None if mem is None else int(mem),
                )
            )
    return found


def _busy(sm: float | None, mem: float | None, reserved_mib: int) -> bool:
    """Real activity in one sample: SM over the threshold, or memory beyond the driver's own by more than it."""
    if sm is not None and sm > policy("MONITORING_TRESPASS_SM_PCT"):
        return True
    return mem is not None and mem - reserved_mib > policy("MONITORING_TRESPASS_MEM_MIB")


def detect_trespass(cluster_id: int, *, at: datetime | None = None) -> TrespassResult | None:
    """Open, keep and end the cluster's TrespassEvents from what trespasses now. None if the cluster is gone.

    One transaction; idempotent (a repeated call with nothing changed writes only last_seen_at).
    Open rows are matched by (unit, kind, pod uid); the partial unique constraint backs that up.
    """
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return None
    at = at or timezone.now()
    result = TrespassResult(findings=find(cluster, at=at))
    wanted = {f.key: f for f in result.findings}
    with transaction.atomic():
        current = {
            (e.unit_key, e.kind, e.pod_uid): e
            for e in TrespassEvent.objects.open().filter(gpu__node__cluster=cluster).select_for_update(of=("self",))
        }
        gone = [e.pk for key, e in current.items() if key not in wanted]
        if gone:
            result.ended = TrespassEvent.objects.filter(pk__in=gone, ended_at__isnull=True).update(ended_at=at)
        seen = [e.pk for key, e in current.items() if key in wanted]
        if seen:
            TrespassEvent.objects.filter(pk__in=seen).update(last_seen_at=at)
        new = [
            TrespassEvent(
                kind=f.kind,
                gpu_id=f.unit[0],
                mig_instance_id=f.unit[1],
                unit_key=unit_key(f.unit),
                owner_project_id=f.owner_project_id,
                project_id=f.project_id,
                workload_id=f.workload_id,
                namespace=f.namespace,
                pod_name=f.pod_name,
                pod_uid=f.pod_uid,
                sm_active=f.sm_active,
                mem_used_mib=f.mem_used_mib,
                started_at=at,
                last_seen_at=at,
            )
            for key, f in wanted.items()
            if key not in current
        ]
        created = TrespassEvent.objects.bulk_create(new, batch_size=1000)
        result.opened = [e.pk for e in created]
        for event in created:
            if event.owner_project_id is not None:
                signals.trespass_opened.send(sender=TrespassEvent, event=event)
        if policy("MONITORING_EVICT_TRESPASS"):
            result.evicting = [e.pk for e in created if e.pod_name] + [
                e.pk for key, e in current.items() if key in wanted and e.pod_name and e.evicted_at is None
            ]
            if result.evicting:
                from monitoring.tasks import evict_trespass_task  # cycle: monitoring.tasks imports this module

                for pk in result.evicting:
                    evict_trespass_task.delay_on_commit(pk)
    if result.opened:
        logger.warning("cluster %s: %d trespass event(s) opened", cluster.name, len(result.opened))
    return result


def foreign_seconds(units: dict[int, Unit], start: datetime, end: datetime) -> dict[int, int]:
    """{key: seconds of [start, end) a foreign pod ran on the unit}, for `units` {key: (gpu id, MIG id)}. One query.

    What the owner of a unit did not use although its unit was busy: idle detection and billing's
    "used" leave this time out (the trespasser pays for it).
    """
    mig = {m: key for key, (g, m) in units.items() if m}
    gpu = {g: key for key, (g, m) in units.items() if not m}
    if not units:
        return {}
    events = TrespassEvent.objects.filter(kind=TrespassKind.FOREIGN_POD, started_at__lt=end).filter(
        Q(ended_at__isnull=True) | Q(ended_at__gt=start)
    )
    events = events.filter(Q(mig_instance_id__in=list(mig)) | Q(gpu_id__in=list(gpu), mig_instance__isnull=True))
    spans: dict[int, list[tuple[datetime, datetime]]] = {}
    for mig_id, gpu_id, started, ended in events.values_list("mig_instance_id", "gpu_id", "started_at", "ended_at"):
        key = mig.get(mig_id) if mig_id else gpu.get(gpu_id)
        if key is not None:
            spans.setdefault(key, []).append((max(started, start), min(ended or end, end)))
    whole = int((end - start).total_seconds())
    return {key: min(whole, sum(int((b - a).total_seconds()) for a, b in pairs)) for key, pairs in spans.items()}


EVICTION_RETRY = timedelta(minutes=5)


def evict_trespasser(event_id: int) -> str:
    """Evict the pod of an open trespass event through the Eviction API; returns what happened.

    Claimed with a conditional UPDATE of eviction_attempted_at (a duplicate task does nothing; a
    refused eviction is retried by a later poll after EVICTION_RETRY).
    """
    now = timezone.now()
    claimed = (
        TrespassEvent.objects.filter(pk=event_id, ended_at__isnull=True, evicted_at__isnull=True)
        .exclude(pod_name="")
        .filter(Q(eviction_attempted_at__isnull=True) | Q(eviction_attempted_at__lte=now - EVICTION_RETRY))
        .update(eviction_attempted_at=now)
    )
    if claimed != 1:
        return "skipped"
    event = TrespassEvent.objects.select_related("gpu__node__cluster").get(pk=event_id)
    try:
        with kube.KubernetesClient.for_cluster(event.gpu.node.cluster) as client:
            client.evict_pod(event.namespace, event.pod_name)
    except kube.NotFound:
        TrespassEvent.objects.filter(pk=event_id).update(error="pod already gone")
        return "gone"
    except kube.KubernetesError as exc:
        logger.info("eviction of trespasser %s/%s refused: %s", event.namespace, event.pod_name, exc)
        TrespassEvent.objects.filter(pk=event_id).update(error=f"{type(exc).__name__}: {exc}"[:2000])
        return "refused"
    TrespassEvent.objects.filter(pk=event_id).update(evicted_at=now, error="")
    return "evicted"

"""Health events: open, bump and resolve them from readings; keep GpuCapacity.health in step.

- One open event per (gpu, mig_instance, rule) (partial unique constraints). A repeated
  observation bumps `last_seen_at` and `occurrences`; resolution sets `resolved_at`.
- GpuCapacity.health follows the open events of the GPU and its instances: any critical ->
  unhealthy (approvals already withhold unhealthy GPUs), else any warning -> warning, else ok.
  "lost" belongs to discovery and is never overwritten here.
- A GPU that turns unhealthy may have its node cordoned (MONITORING_CORDON_ON_CRITICAL), through
  cordon_node_task after commit.

Locking: the open events of the units being evaluated are locked (SELECT ... FOR UPDATE, primary
key order) for the transaction, which serialises a poll with an operator resolving the same events.
Capacity rows are not locked; their health is written through capacity.services.health (conditional
UPDATEs). Idempotent: the same reading applied twice leaves the same rows (occurrences aside).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from capacity.adapters import kubernetes as kube
from capacity.choices import GpuHealth
from capacity.models import GpuCapacity, NodeCapacity
from capacity.services.health import set_gpu_health
from monitoring import health as rules
from monitoring.choices import HealthLevel, MetricSource
from monitoring.models import HealthEvent
from policies import policy
from pools import services as pool_services

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class UnitHealth:
    """The health-relevant reading of one unit: a GPU (mig_instance_id None) or one of its MIG instances."""

    gpu_id: int
    mig_instance_id: int | None
    reading: rules.Reading


@dataclass(slots=True)
class HealthOutcome:
    opened: list[int] = field(default_factory=list)
    bumped: int = 0
    resolved: list[int] = field(default_factory=list)
    newly_unhealthy: list[int] = field(default_factory=list)


def apply_health(units: list[UnitHealth], *, at: datetime, source: str = MetricSource.NVML) -> HealthOutcome:
    """Evaluate the rules on each unit's reading and write the events; then sync the GPUs' health."""
    outcome = HealthOutcome()
    if not units:
        return outcome
    gpu_ids = sorted({u.gpu_id for u in units})
    with transaction.atomic():
        open_events = {
            (e.gpu_id, e.mig_instance_id, e.rule): e
            for e in HealthEvent.objects.open().filter(gpu_id__in=gpu_ids).select_for_update().order_by("pk")
        }
        for unit in units:
            findings, evaluated = rules.evaluate(unit.reading)
            for rule, finding in findings.items():
                event = open_events.get((unit.gpu_id, unit.mig_instance_id, rule))
                if event is not None:
                    _bump(event, finding, at)
                    outcome.bumped += 1
                else:
                    event = _open(unit, finding, at, source)
                    open_events[(unit.gpu_id, unit.mig_instance_id, rule)] = event
                    outcome.opened.append(event.pk)
            for rule in evaluated - findings.keys():
                event = open_events.get((unit.gpu_id, unit.mig_instance_id, rule))
                if event is None or at - event.last_seen_at < timedelta(seconds=rules.clear_after_s(rule)):
                    continue
                if HealthEvent.objects.filter(pk=event.pk, resolved_at__isnull=True).update(resolved_at=at) == 1:
                    outcome.resolved.append(event.pk)
                del open_events[(unit.gpu_id, unit.mig_instance_id, rule)]
        if outcome.opened or outcome.resolved:
            outcome.newly_unhealthy = sync_gpu_health(gpu_ids)
    return outcome


def _bump(event: HealthEvent, finding: rules.Finding, at: datetime) -> None:
    if at <= event.last_seen_at:
        return  # the same (or an older) reading again: nothing new
    event.last_seen_at = at
    event.occurrences += 1
    event.value, event.message, event.level = finding.value, finding.message[:300], finding.level
    event.save(update_fields=["last_seen_at", "occurrences", "value", "message", "level"])


def _open(unit: UnitHealth, finding: rules.Finding, at: datetime, source: str) -> HealthEvent:
    try:
        with transaction.atomic():
            return HealthEvent.objects.create(
                gpu_id=unit.gpu_id,
                mig_instance_id=unit.mig_instance_id,
                rule=finding.rule,
                level=finding.level,
                source=source,
                value=finding.value,
                message=finding.message[:300],
                opened_at=at,
                last_seen_at=at,
            )
    except IntegrityError:  # opened concurrently by another poll: bump that one
        event = (
            HealthEvent.objects.open()
            .select_for_update()
            .get(gpu_id=unit.gpu_id, mig_instance_id=unit.mig_instance_id, rule=finding.rule)
        )
        _bump(event, finding, at)
        return event


def desired_health(gpu_ids: list[int]) -> dict[int, str]:
    """ok / warning / unhealthy per GPU from its open events (and those of its MIG instances)."""
    levels: dict[int, set[str]] = defaultdict(set)
    for gpu_id, level in HealthEvent.objects.open().filter(gpu_id__in=gpu_ids).values_list("gpu_id", "level"):
        levels[gpu_id].add(level)
    result = {}
    for gpu_id in gpu_ids:
        if HealthLevel.CRITICAL in levels[gpu_id]:
            result[gpu_id] = GpuHealth.UNHEALTHY
        elif HealthLevel.WARNING in levels[gpu_id]:
            result[gpu_id] = GpuHealth.WARNING
        else:
            result[gpu_id] = GpuHealth.OK
    return result


def sync_gpu_health(gpu_ids: list[int]) -> list[int]:
    """Write the desired health onto the GPUs (never touching "lost"); returns GPUs that became unhealthy.

    Enqueues cordon_node_task after commit for those when MONITORING_CORDON_ON_CRITICAL is on, and a
    queue pass (pools) when a GPU's health cleared.
    """
    became_unhealthy, became_usable = [], False
    for gpu_id, health in desired_health(gpu_ids).items():
        if set_gpu_health(gpu_id, health):
            if health == GpuHealth.UNHEALTHY:
                became_unhealthy.append(gpu_id)
            else:
                became_usable = True
    if became_usable:  # its units may be free again: a queue pass after commit
        pool_services.enqueue_queue_processing()
    if became_unhealthy and policy("MONITORING_CORDON_ON_CRITICAL"):
        from monitoring.tasks import cordon_node_task  # cycle: monitoring.tasks imports this module

        node_ids = sorted(set(GpuCapacity.objects.filter(pk__in=became_unhealthy).values_list("node_id", flat=True)))
        for node_id in node_ids:
            cordon_node_task.delay_on_commit(node_id, "critical GPU health event")
    return became_unhealthy


def resolve_events(event_ids: list[int], *, actor=None, note: str = "", at: datetime | None = None) -> int:
    """Resolve open events by hand (operator); returns how many were open. GPUs' health is re-synced.

    A condition still present opens a new event at the next reading.
    """
    at = at or timezone.now()
    with transaction.atomic():
        events = list(
            HealthEvent.objects.open()
            .filter(pk__in=event_ids)
            .select_for_update()
            .order_by("pk")
            .values("pk", "gpu_id")
        )
        done = HealthEvent.objects.filter(pk__in=[e["pk"] for e in events], resolved_at__isnull=True).update(
            resolved_at=at,
            resolved_by=actor if getattr(actor, "is_authenticated", False) else None,
            resolution=(note or "resolved by an operator")[:200],
        )
        sync_gpu_health(sorted({e["gpu_id"] for e in events}))
    return done


def cordon_node(node_id: int) -> bool:
    """Cordon a node through the Kubernetes adapter; True if the API accepted it."""
    node = NodeCapacity.objects.select_related("cluster").filter(pk=node_id, gone_at__isnull=True).first()
    if node is None or node.cordoned:
        return False
    try:
        with kube.KubernetesClient.for_cluster(node.cluster) as client:
            client.cordon(node.name)
    except kube.KubernetesError as exc:
        logger.warning("cordoning %s after a critical GPU event failed: %s", node, exc)
        return False
    return True  # NodeCapacity.cordoned is mirrored by the next discovery

"""Time-sliced GPUs: pods far above their memory or compute share are flagged and, by policy, evicted.

Time-slicing gives no memory or performance isolation: one pod can take the whole framebuffer, or
keep the SMs busy, and starve the others. A pod's share is 1 / replicas; it is over when its
processes' memory (NVML running processes) exceeds total / replicas x MONITORING_SHARE_FACTOR_PCT
/ 100, or their SM utilisation (nvmlDeviceGetProcessUtilization) exceeds 100 / replicas % x the
same factor. The seed's tier 3 (development)
advice is to evict such pods; gpuaas does so only when MONITORING_EVICT_OVER_SHARE is on, through
the Eviction API (PodDisruptionBudgets are honoured; a refused eviction is retried later).

Priorities: each time-sliced or MPS pool has an operator-chosen share priority (pools.GpuPool.share_priority,
high / normal / low). On one GPU, only the over-share pods of the lowest priority present are evicted in a
poll; a higher-priority pod over its share stays open, not evicted, while a lower-priority pod on that GPU
is over its share and not yet evicted, so lower priorities are always evicted first. A pod no pool of its
project on that GPU accounts for ranks below "low".

Processes are attributed to pods by the pod UID NVML's adapter resolves (cgroup, or the
simulator's own answer); without one (a node agent without the host's PID namespace cannot read a
process's cgroup), by the only running workload whose device ids (`<uuid>::<n>`, as the kubelet's
PodResources lists them) name this GPU. Anything else is left unattributed.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from capacity.adapters import kubernetes as kube
from capacity.adapters import nvml
from capacity.choices import SHARED_SPEC_KINDS
from capacity.models import GpuCapacity, NodeCapacity, WorkloadProfile
from monitoring.choices import ShareState
from monitoring.models import ShareViolation
from policies import policy
from pools.choices import SHARE_PRIORITY_RANK
from pools.models import Allocation

logger = logging.getLogger(__name__)

EVICTION_RETRY = timedelta(minutes=5)
UNPOOLED = ""  # a pod with no shared pool of its project on the GPU: ranks below every share priority


def share_priorities(gpu_ids: list[int]) -> dict[tuple[int, int], str]:
    """(gpu id, project id) -> the highest share priority of the project's shared pools holding a replica of that
    GPU, one query. A project with pools of several priorities on one GPU is ranked by its highest."""
    out: dict[tuple[int, int], str] = {}
    rows = (
        Allocation.objects.active()
        .filter(gpu_id__in=gpu_ids, kind__in=SHARED_SPEC_KINDS)
        .values_list("gpu_id", "project_id", "pool__share_priority")
        .order_by()
    )
    for gpu_id, project_id, priority in rows:
        if _rank(priority) > _rank(out.get((gpu_id, project_id), UNPOOLED)):
            out[(gpu_id, project_id)] = priority
    return out


def _rank(priority: str) -> int:
    return SHARE_PRIORITY_RANK.get(priority, -1)


def share_mib(total_mib: int, replicas: int) -> int:
    return total_mib // max(1, replicas)


def limit_mib(total_mib: int, replicas: int) -> int:
    """Memory above which a pod is over its share."""
    return share_mib(total_mib, replicas) * policy("MONITORING_SHARE_FACTOR_PCT") // 100


def limit_sm_pct(replicas: int) -> int:
    """SM utilisation above which a pod is over its compute share."""
    return 100 * policy("MONITORING_SHARE_FACTOR_PCT") // 100 // max(1, replicas)


def pod_sm_util(gpu: GpuCapacity, processes: list[nvml.ProcessInfo], workloads: list[WorkloadProfile]) -> dict:
    """pod UID -> SM utilisation % of its processes on this GPU (only processes that were measured)."""
    return _per_pod(gpu, processes, workloads, "sm_util_pct")


def pod_memory(gpu: GpuCapacity, processes: list[nvml.ProcessInfo], workloads: list[WorkloadProfile]) -> dict:
    """pod UID -> MiB used on this GPU; processes without an attributable pod are skipped."""
    return _per_pod(gpu, processes, workloads, "used_memory_mib")


def _per_pod(gpu: GpuCapacity, processes: list[nvml.ProcessInfo], workloads: list[WorkloadProfile], field: str) -> dict:
    """pod UID -> the sum of one measured process field on this GPU (see the module docstring for attribution)."""
    on_gpu = [w for w in workloads if w.gpu_id == gpu.pk or any(str(d).startswith(gpu.uuid) for d in w.device_ids)]
    fallback = on_gpu[0].pod_uid if len(on_gpu) == 1 else None
    used: dict[str, int] = defaultdict(int)
    for process in processes:
        pod_uid = process.pod_uid or fallback
        value = getattr(process, field)
        if pod_uid and value is not None:
            used[pod_uid] += value
    return dict(used)


def check_shares(node: NodeCapacity, shared: list[tuple[GpuCapacity, nvml.GpuMetrics]], *, at: datetime) -> int:
    """Open, refresh or resolve ShareViolation rows for the time-sliced GPUs of one poll; returns open ones."""
    return check_node_shares([(node, shared)], at=at).get(node.pk, 0)


def check_node_shares(
    polls: list[tuple[NodeCapacity, list[tuple[GpuCapacity, nvml.GpuMetrics]]]], *, at: datetime
) -> dict[int, int]:
    """check_shares for many nodes' polls at once (the ingest worker's batch); open violations per node id.

    Three reads for the whole batch: the nodes' running workloads, their GPUs' share priorities, and the
    unresolved violations of their GPUs (FOR UPDATE, primary-key order: the lock). A GPU is anything with pk,
    uuid and memory_mib. Evictions are enqueued after commit. Idempotent for a repeated poll.
    """
    polls = [(node, shared) for node, shared in polls if shared]
    if not polls:
        return {}
    workloads: dict[int, list[WorkloadProfile]] = defaultdict(list)
    running = WorkloadProfile.objects.running().filter(node_id__in=sorted({node.pk for node, _ in polls}))
    for workload in running.select_related("project"):
        workloads[workload.node_id].append(workload)
    gpu_ids = sorted({g.pk for _, shared in polls for g, _ in shared})
    priorities = share_priorities(gpu_ids)
    open_counts: dict[int, int] = {}
    evict: list[int] = []
    with transaction.atomic():
        current = {
            (v.gpu_id, v.pod_uid): v
            for v in ShareViolation.objects.filter(gpu_id__in=gpu_ids, resolved_at__isnull=True)
            .select_for_update()
            .order_by("pk")
        }
        for node, shared in polls:
            open_counts[node.pk] = _check_node(node, shared, workloads[node.pk], current, evict, priorities, at=at)
        # Still unresolved but no longer over (or the pod is gone): resolved.
        resolved = [v.pk for v in current.values()]
        if resolved:
            ShareViolation.objects.filter(pk__in=resolved, resolved_at__isnull=True).update(
                resolved_at=at, state=_resolved_state()
            )
        if evict:
            from monitoring.tasks import evict_over_share_task  # cycle: monitoring.tasks imports this module

            for pk in evict:
                evict_over_share_task.delay_on_commit(pk)
    return open_counts


def _check_node(
    node, shared, workloads: list[WorkloadProfile], current: dict, evict: list[int], priorities: dict, *, at
) -> int:
    """One node's share check inside check_node_shares' transaction: the violations still over are taken out of
    `current` (what remains there is resolved), the ones due for eviction added to `evict` (on each GPU, those of
    the lowest share priority present only); returns open ones."""
    replicas = node.timeslice_replicas
    by_pod = {w.pod_uid: w for w in workloads}
    open_count = 0
    for gpu, reading in shared:
        total = reading.memory_total_mib or gpu.memory_mib
        limit = limit_mib(total, replicas)
        memory = pod_memory(gpu, reading.processes, workloads)
        compute = pod_sm_util(gpu, reading.processes, workloads)
        over_memory = {pod for pod, mib in memory.items() if mib > limit}
        over_compute = {pod for pod, pct in compute.items() if pct > limit_sm_pct(replicas)}
        over = {pod: memory.get(pod, 0) for pod in sorted(over_memory | over_compute)}
        pod_priority = {
            pod: priorities.get((gpu.pk, by_pod[pod].project_id), UNPOOLED) if pod in by_pod else UNPOOLED
            for pod in over
        }
        due: list[tuple[int, ShareViolation]] = []
        for pod_uid, used in over.items():
            what = "+".join(
                name for name, pods in (("memory", over_memory), ("compute", over_compute)) if pod_uid in pods
            )
            violation = current.pop((gpu.pk, pod_uid), None)
            workload = by_pod.get(pod_uid)
            if violation is None:
                violation = ShareViolation.objects.create(
                    gpu_id=gpu.pk,
                    workload=workload,
                    project=workload.project if workload else None,
                    namespace=workload.namespace if workload else "",
                    pod_name=workload.pod_name if workload else "",
                    pod_uid=pod_uid,
                    used_mib=used,
                    share_mib=share_mib(total, replicas),
                    replicas=replicas,
                    sm_util_pct=compute.get(pod_uid),
                    over=what,
                    share_priority=pod_priority[pod_uid],
                    first_seen_at=at,
                    last_seen_at=at,
                )
            else:
                ShareViolation.objects.filter(pk=violation.pk).update(
                    used_mib=used,
                    sm_util_pct=compute.get(pod_uid),
                    over=what,
                    share_priority=pod_priority[pod_uid],
                    last_seen_at=at,
                )
            open_count += 1
            if policy("MONITORING_EVICT_OVER_SHARE") and violation.state != ShareState.EVICTED:
                due.append((_rank(pod_priority[pod_uid]), violation))
        evict += _lowest_first(due, at)
    return open_count


def _lowest_first(due: list[tuple[int, ShareViolation]], at: datetime) -> list[int]:
    """Of one GPU's over-share violations (rank, row), the ones of the lowest rank present that are due for eviction.
    A higher-ranked pod waits while a lower-ranked one on the GPU is over its share and not evicted yet (an evicted
    row's pod is going: it no longer holds the others back)."""
    if not due:
        return []
    lowest = min(rank for rank, _ in due)
    return [v.pk for rank, v in due if rank == lowest and _due_for_eviction(v, at)]


def _resolved_state():
    """An evicted pod's row keeps "evicted" when it resolves; any other becomes "resolved"."""
    return Case(When(state=ShareState.EVICTED, then=F("state")), default=Value(ShareState.RESOLVED))


def _due_for_eviction(violation: ShareViolation, at: datetime) -> bool:
    if not (violation.namespace and violation.pod_name) or violation.state == ShareState.EVICTED:
        return False
    return violation.eviction_attempted_at is None or at - violation.eviction_attempted_at >= EVICTION_RETRY


def evict_over_share(violation_id: int) -> str | None:
    """Evict the pod of an unresolved violation through the Eviction API; returns the new state.

    Claimed with a conditional UPDATE of eviction_attempted_at (a duplicate task does nothing).
    """
    now = timezone.now()
    claimed = (
        ShareViolation.objects.filter(pk=violation_id, resolved_at__isnull=True)
        .exclude(state=ShareState.EVICTED)
        .filter(Q(eviction_attempted_at__isnull=True) | Q(eviction_attempted_at__lte=now - EVICTION_RETRY / 2))
        .update(eviction_attempted_at=now)
    )
    if claimed != 1:
        return None
    violation = ShareViolation.objects.select_related("gpu__node__cluster").get(pk=violation_id)
    try:
        with kube.KubernetesClient.for_cluster(violation.gpu.node.cluster) as client:
            client.evict_pod(violation.namespace, violation.pod_name)
    except kube.NotFound:
        ShareViolation.objects.filter(pk=violation_id).update(
            state=ShareState.RESOLVED, resolved_at=now, error="pod already gone"
        )
        return ShareState.RESOLVED
    except kube.KubernetesError as exc:
        logger.info("eviction of %s/%s refused: %s", violation.namespace, violation.pod_name, exc)
        ShareViolation.objects.filter(pk=violation_id).update(
            state=ShareState.EVICTION_FAILED, error=f"{type(exc).__name__}: {exc}"[:2000]
        )
        return ShareState.EVICTION_FAILED
    ShareViolation.objects.filter(pk=violation_id).update(state=ShareState.EVICTED, evicted_at=now, error="")
    return ShareState.EVICTED

"""Idle reservations: active allocations whose partition did (almost) nothing over the window.

The seed's guidance: an allocated GPU should run above 50 % (ideally 75-85 %); at or below 20 %
it is under-used. gpuaas flags the clear cases: average SM activity below MONITORING_IDLE_SM_PCT
(5 %) over MONITORING_IDLE_WINDOW_H (24 h), for allocations held at least that long, when samples
cover at least MONITORING_IDLE_MIN_COVERAGE_PCT of the window (missing data is not idleness).
Where SM activity is unavailable (Ampere full GPUs: no GPM), NVML's GPU utilisation stands in:
it is an upper bound of SM activity, so a low value is still a safe "idle".

Proposal: release when the unit's memory stayed under MONITORING_IDLE_MEM_MIB (nothing loaded);
otherwise downsize to the smallest MIG profile of the same product whose memory holds the peak
with 10 % headroom and that has fewer compute slices; release when none does.
Time-sliced replicas are not assessed: their GPU-level activity belongs to several tenants. A vGPU is
assessed on its own series (a vm-vgpu host reports each vGPU: NVML's per-vGPU SM utilisation, framebuffer in
use), the one its project's VM holds (readers.vgpu_series); an idle vGPU is proposed for release, or for a
smaller vGPU type of the same GPU whose framebuffer holds the peak with headroom.
Activity follows the device: a unit's own series says what ran on it, so a reservation whose pods ran
elsewhere is idle; and while another project's pod trespassed on it (TrespassEvent, foreign pod), that
share of the window is taken out of the owner's activity (taken as even over the window).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from capacity.choices import SpecKind
from capacity.mig.catalog import find_product
from capacity.models import MigProfile
from capacity.vgpu import VGPU_TYPES, types_for_product
from monitoring import readers, signals
from monitoring.choices import IdleProposal, IdleState
from monitoring.models import IdleReservation
from policies import policy
from pools import services as pool_services
from pools.models import Allocation

from .trespass import foreign_seconds

logger = logging.getLogger(__name__)

HEADROOM = 1.1


def suggest(allocation, mem_used_max: int | None) -> tuple[str, str]:
    """(proposal, suggested profile name) for an idle allocation."""
    if mem_used_max is None or mem_used_max <= policy("MONITORING_IDLE_MEM_MIB"):
        return IdleProposal.RELEASE, ""
    if allocation.kind == SpecKind.VGPU:
        return _smaller_vgpu(allocation, mem_used_max)
    product = find_product(allocation.product)
    current = allocation.compute_slices or (product.compute_slices if product else 7)
    candidates = (
        MigProfile.objects.filter(
            product=product.key if product else allocation.product,
            compute_slices__lt=current,
            memory_mib__gte=int(mem_used_max * HEADROOM),
        )
        .exclude(name__contains="+")
        .order_by("compute_slices", "memory_mib", "name")
    )
    smaller = candidates.first()
    if smaller is None:
        return IdleProposal.RELEASE, ""
    return IdleProposal.DOWNSIZE, smaller.name


def _smaller_vgpu(allocation, mem_used_max: int) -> tuple[str, str]:
    current = VGPU_TYPES.get(allocation.profile_name)
    if current is None:
        return IdleProposal.RELEASE, ""
    fits = [
        t
        for t in types_for_product(current.product)
        if t.name.rsplit("-", 1)[0] == current.name.rsplit("-", 1)[0]  # the same board's types (H100XM-*)
        and t.framebuffer_gb < current.framebuffer_gb
        and t.framebuffer_gb * 1024 >= mem_used_max * HEADROOM
    ]
    return (IdleProposal.DOWNSIZE, fits[0].name) if fits else (IdleProposal.RELEASE, "")


def detect_idle(*, now: datetime | None = None) -> dict[str, int]:
    """Flag idle active allocations, refresh open flags, clear flags of busy or released units.

    Idempotent: one open flag per allocation (partial unique constraint); a repeated run updates it.
    """
    now = now or timezone.now()
    window = timedelta(hours=policy("MONITORING_IDLE_WINDOW_H"))
    start = now - window
    threshold = policy("MONITORING_IDLE_SM_PCT")
    min_coverage = policy("MONITORING_IDLE_MIN_COVERAGE_PCT") / 100
    allocations = list(
        Allocation.objects.active()
        .filter(kind__in=[SpecKind.MIG, SpecKind.FULL, SpecKind.VGPU], allocated_at__lte=start)
        .order_by("pk")
    )
    series = readers.allocation_series(allocations)
    stats = readers.window_stats(sorted(set(series.values())), start, now)
    # A vGPU's GPU carries other projects' VMs by design: no trespass to take out.
    owned = {a.pk: (a.gpu_id, a.mig_instance_id) for a in allocations if a.kind != SpecKind.VGPU}
    foreign = foreign_seconds(owned, start, now)
    result = {"assessed": 0, "flagged": 0, "cleared": 0, "no_data": 0}
    idle_ids = []
    with transaction.atomic():
        open_flags = {f.allocation_id: f for f in IdleReservation.objects.open().select_for_update().order_by("pk")}
        for allocation in allocations:
            s = stats.get(series.get(allocation.pk, -1))
            activity = None if s is None else (s.sm_active_avg if s.sm_active_avg is not None else s.gpu_util_avg)
            if s is None or activity is None or s.coverage(window, settings.METRICS_INTERVAL_S) < min_coverage:
                result["no_data"] += 1
                continue
            result["assessed"] += 1
            if foreign.get(allocation.pk):
                activity *= max(0.0, 1 - foreign[allocation.pk] / window.total_seconds())
            if activity >= threshold:
                continue
            idle_ids.append(allocation.pk)
            proposal, profile = suggest(allocation, s.mem_used_max)
            values = {
                "window_start": start,
                "window_end": now,
                "sm_active_avg": round(activity, 3),
                "sm_active_max": s.sm_active_max,
                "mem_used_max_mib": s.mem_used_max,
                "coverage": round(s.coverage(window, settings.METRICS_INTERVAL_S), 3),
                "proposal": proposal,
                "suggested_profile": profile,
                "updated_at": now,
            }
            flag = open_flags.pop(allocation.pk, None)
            if flag is None:
                flag = IdleReservation.objects.create(allocation=allocation, detected_at=now, **values)
                signals.idle_reservation_flagged.send(sender=IdleReservation, flag=flag)
                result["flagged"] += 1
            else:
                IdleReservation.objects.filter(pk=flag.pk).update(**values)
        # Open flags left: the unit is busy again, lacks data now, or the allocation is released.
        stale = [f.pk for f in open_flags.values()]
        if stale:
            result["cleared"] = IdleReservation.objects.filter(pk__in=stale, state=IdleState.OPEN).update(
                state=IdleState.CLEARED, closed_at=now, updated_at=now
            )
    return result


def dismiss(flag_ids: list[int], *, actor=None) -> int:
    """Operator: keep the reservation; the flag closes (a later detection may flag it again)."""
    now = timezone.now()
    return IdleReservation.objects.filter(pk__in=flag_ids, state=IdleState.OPEN).update(
        state=IdleState.DISMISSED, closed_at=now, updated_at=now, closed_by=_user(actor)
    )


def release_idle(flag_id: int, *, actor=None) -> bool:
    """Operator, one step: release the flagged allocation; False if the flag is no longer open.

    The release is the pools app's (pools.services.release_unit): the whole request when the unit is
    its pool's last, otherwise only this unit with the project's quota reconciled after commit.
    Claimed with a conditional UPDATE on the flag; the release runs in the same transaction.
    """
    now = timezone.now()
    with transaction.atomic():
        claimed = IdleReservation.objects.filter(pk=flag_id, state=IdleState.OPEN).update(
            state=IdleState.RELEASED, closed_at=now, updated_at=now, closed_by=_user(actor)
        )
        if claimed != 1:
            return False
        flag = IdleReservation.objects.select_related("allocation__pool__request").get(pk=flag_id)
        reason = f"idle: {flag.sm_active_avg:.1f}% SM activity over {policy('MONITORING_IDLE_WINDOW_H')} h"
        pool_services.release_unit(flag.allocation, actor=_user(actor), reason=reason, at=now)
    return True


def _user(actor):
    return actor if actor is not None and getattr(actor, "is_authenticated", False) else None

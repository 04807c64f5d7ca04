"""Matching against the live fleet: candidates, tier policy, prices and a start forecast per offer.

The API's dry run and request creation both call `match_declared()`, so what the dry run shows is
what a request gets.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django.utils import timezone

from capacity import tiers
from capacity.choices import SpecKind
from pools.forecast import estimate_start
from pricing.lookup import price_lookup

from ..choices import WorkloadType
from ..models import PoolRequest
from . import candidates, matching
from .verdict import verdict


def match_declared(
    *,
    workload_type: str,
    memory_gib: int | None = None,
    compute_fraction: Decimal | None = None,
    isolation: str = "",
    count: int = 1,
    product: str = "",
    cluster_id: int | None = None,
    start_at: dt.datetime | None = None,
    end_at: dt.datetime | None = None,
    kinds: frozenset[str] | None = None,
    forecast: bool = True,
    vm: bool = False,
    vgpu_type: str = "",
) -> matching.Match:
    """Match a declaration against what the fleet offers now; `kinds` narrows to kinds the team pinned, and
    `vgpu_type` (a VM naming its vGPU type) to that type's offer."""
    need = matching.Need.from_request(
        start_at=start_at,
        end_at=end_at,
        workload_type=workload_type,
        memory_gib=memory_gib,
        compute_fraction=compute_fraction,
        isolation=isolation,
        count=count,
        product=product,
        vm=vm,
    )
    offered = candidates.fleet_candidates(cluster_id=cluster_id)
    if kinds is not None:
        offered = [c for c in offered if c.kind in kinds]
    if vgpu_type:
        offered = [c for c in offered if c.kind == SpecKind.VGPU and c.profile_name == vgpu_type]
    result = matching.match(need, offered, price=price_lookup(), policy_table=tiers.policies())
    if forecast:
        for offer in result.offers:
            forecast_start(offer, cluster_id=cluster_id, start_at=start_at, workload_type=workload_type)
    return result


def forecast_start(
    offer: matching.Offer, *, cluster_id: int | None, start_at: dt.datetime | None, workload_type: str = ""
) -> None:
    """When the offer could start: now (or the requested start) when its units are free on one cluster today
    (verdict(), with the units the tier policy withholds named); never, when no unit would ever serve it;
    otherwise the queue's wait-time forecast (pools.forecast.estimate_start: P50 as the start, P50 and P90 in
    the note). vGPU offers say only whether their vGPUs are free (the forecast has no vGPU hold history)."""
    spec = offer.spec()
    if spec["spec_kind"] == SpecKind.VGPU:
        free = candidates.free_vgpus(spec["profile_name"], cluster_id=cluster_id)
        offer.forecast = "free now" if free >= spec["count"] else f"waits: {free} of {spec['count']} vGPUs free"
        if free >= spec["count"]:
            offer.forecast_start = max(start_at or timezone.now(), timezone.now())
        return
    probe = PoolRequest(
        spec_kind=spec["spec_kind"],
        isolation=spec["isolation"],
        tier=spec["tier"],
        product=spec["product"],
        profile_name=spec["profile_name"],
        count=spec["count"],
        cluster_id=cluster_id,
        workload_type=workload_type or WorkloadType.INFERENCE,
        start_at=start_at or timezone.now(),
    )
    found = verdict(probe)  # the same answer as the form's check and approval
    if found.fits:
        offer.forecast_start = max(start_at or timezone.now(), timezone.now())
        offer.forecast = "free now"
    elif not found.servable:
        offer.forecast = f"never: {found.refusal}"
    else:
        where = "on one node" if probe.spec_kind == SpecKind.FULL and probe.count > 1 else "on one cluster"
        offer.forecast = f"waits: {found.free} of {probe.count} units free {where}"
        if found.withheld:
            offer.forecast += f"; {found.withheld_sentence()}"
        estimate = estimate_start(probe)
        if estimate.p50 is not None:
            offer.forecast_start = estimate.p50
            p90 = f", P90 {estimate.p90:%Y-%m-%d %H:%M}" if estimate.p90 is not None else ""
            offer.forecast += f"; likely start P50 {estimate.p50:%Y-%m-%d %H:%M} UTC{p90}"

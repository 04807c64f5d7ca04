"""The offers of a declaration with a start forecast each: pools.units.offers.match_declared() matches (what the
request would get), forecast_start() says when each offer could start (scheduling.forecast).

The API's dry run reads match_declared() here; request creation reads pools.units.offers.match_declared() (no
forecast), so what the dry run shows is what a request gets.
"""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

from capacity.choices import SpecKind
from pools import units
from pools.choices import WorkloadType
from pools.models import PoolRequest
from pools.units import candidates, matching
from pools.units import offers as pool_offers

from .forecast import estimate_start


def match_declared(*, forecast: bool = True, **declared) -> matching.Match:
    """pools.units.offers.match_declared(**declared), and with `forecast` each offer's start (forecast_start)."""
    result = pool_offers.match_declared(**declared)
    if forecast:
        for offer in result.offers:
            forecast_start(
                offer,
                cluster_id=declared.get("cluster_id"),
                start_at=declared.get("start_at"),
                workload_type=declared["workload_type"],
            )
    return result


def forecast_start(
    offer: matching.Offer, *, cluster_id: int | None, start_at: dt.datetime | None, workload_type: str = ""
) -> None:
    """When the offer could start: now (or the requested start) when its units are free on one cluster today
    (units.verdict, with the units the tier policy withholds named); never, when no unit would ever serve it;
    otherwise the queue's wait-time forecast (scheduling.forecast.estimate_start: P50 as the start, P50 and P90 in
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
    found = units.verdict(probe)  # the same answer as the form's check and approval
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

"""Matching against the live fleet: candidates, tier policy and prices per offer.

The API's dry run (with a start forecast per offer: scheduling.offers) and request creation both call
`match_declared()`, so what the dry run shows is what a request gets.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from capacity import tiers
from capacity.choices import SpecKind
from pricing.lookup import price_lookup

from . import candidates, matching


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
    return matching.match(need, offered, price=price_lookup(), policy_table=tiers.policies())

"""The one answer every screen gives about a request's units (Verdict): free now, withheld by the tier policy,
and whether any unit of the fleet could ever serve it; the refusals, shortages and hints built from it."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Count

from capacity import tiers
from capacity.choices import Availability, SpecKind
from capacity.mig.catalog import PRODUCTS, find_product
from capacity.mig.planner import GpuState, plan_onto_gpus
from capacity.models import Cluster, GpuCapacity, MigInstance

from ..models import PoolRequest
from . import topology
from .free import FreeUnits, _tier_q, full_candidates, full_hosts, may_span, read_free, usable_free

# The one answer every screen gives about a request's units: free now (what approval would take),
# withheld by the tier policy (Availability.TIER_POLICY, named with the tier's rule), and whether any
# unit of the fleet could ever serve it under the current policy. The form's check, the API's dry run,
# the forecast, approval's refusal and the submit-time refusal all read it here.


@dataclass(frozen=True)
class Verdict:
    """What approval would do with a request's units now, and why not where it would not."""

    spec: str  # unit_label(): "H100-80GB 1g.10gb"
    need: int
    free_by_cluster: dict[int, int]
    free: int  # usable_free(): what one approval could take now
    withheld: int  # units of the spec on the request's tiers that the tier policy withholds
    reason: (
        str  # withheld_label() of the tier that withholds them: "Withheld by tier policy (tier 1 takes 3g and larger)"
    )
    refusal: str = ""  # why no unit would ever serve it, with the nearest offer that would: "" when one could

    @property
    def fits(self) -> bool:
        return self.free >= self.need

    @property
    def servable(self) -> bool:
        return not self.refusal

    def withheld_sentence(self) -> str:
        """ "31 x H100-80GB 1g.10gb withheld by tier policy (tier 1 takes 3g and larger)", or "" when none are."""
        if not self.withheld:
            return ""
        return f"{self.withheld} x {self.spec} {self.reason[0].lower()}{self.reason[1:]}"


def verdict(request: PoolRequest, free: FreeUnits | None = None) -> Verdict:
    """The request's Verdict: read_free() (unless given as `free`) and, for MIG, the units the tier policy
    withholds and whether any GPU of the request's tiers may ever carry its profile (never_served())."""
    read = free if free is not None else read_free(request)
    usable = usable_free(request, read.by_cluster)
    if request.spec_kind != SpecKind.MIG:
        return Verdict(unit_label(request), request.count, read.by_cluster, usable, 0, "")
    table = tiers.policies()
    withheld = _withheld_tiers(request, read.busy_devices)
    refused = never_served(request, table)
    if withheld:
        reason = tiers.withheld_label(withheld[0][0], table)
    else:
        reason = tiers.withheld_label(refused[0], table) if refused else ""
    return Verdict(
        unit_label(request),
        request.count,
        read.by_cluster,
        usable,
        sum(n for _, n in withheld),
        reason,
        _refusal(refused, table),
    )


def refusal(request: PoolRequest) -> str:
    """Why no unit would ever serve `request` under the tier policy, with the nearest offer that would:
    "Withheld by tier policy (tier 1 takes 3g and larger); 4 x 3g.40gb would be served" (the words every screen
    uses for a withheld unit); "" when a unit could (never_served())."""
    table = tiers.policies()
    return _refusal(never_served(request, table), table)


def _refusal(refused: tuple[str, str] | None, table: dict) -> str:
    if refused is None:
        return ""
    tier, nearest = refused
    return tiers.withheld_label(tier, table) + (f"; {nearest}" if nearest else "")


def never_served(request: PoolRequest, table: dict | None = None) -> tuple[str, str] | None:
    """(tier, nearest offer) when the tier policy keeps the request's MIG profile off every GPU that could
    carry it (present MIG GPUs of its product, tiers and cluster), so no unit would ever serve it; None when
    one could, or when no such GPU exists at all (that is not the policy's doing). Two queries."""
    if request.spec_kind != SpecKind.MIG:
        return None
    table = table if table is not None else tiers.policies()
    hosts = _mig_hosts(request)
    host_tiers = sorted(set(hosts.order_by().values_list("node__tier", flat=True).distinct()))
    allowed = tiers.tiers_allowing(request.product, request.profile_name, table)
    if not host_tiers or any(t in allowed for t in host_tiers):
        return None
    return host_tiers[0], _nearest(request, host_tiers[0], hosts, table)


def _withheld_tiers(request: PoolRequest, busy_devices: frozenset[str] | None) -> list[tuple[str, int]]:
    """(node tier, units) of the request's spec that the tier policy withholds, the most first."""
    queryset = MigInstance.objects.annotate_availability(busy_devices).filter(
        _tier_q(request, (), "gpu__"), profile__name=request.profile_name, availability=Availability.TIER_POLICY
    )
    if request.product:
        queryset = queryset.filter(profile__product=request.product)
    if request.cluster_id:
        queryset = queryset.filter(gpu__node__cluster_id=request.cluster_id)
    rows = queryset.values("gpu__node__tier").annotate(n=Count("pk")).order_by()
    return sorted(((r["gpu__node__tier"], r["n"]) for r in rows), key=lambda tn: (-tn[1], tn[0]))


def _mig_hosts(request: PoolRequest, gpus=None):
    """MIG GPUs (of `gpus`, default present ones) of the request's product, tiers and cluster: where its
    profile could live, whatever the tier policy says."""
    gpus = (GpuCapacity.objects.present() if gpus is None else gpus).filter(_tier_q(request, ()), mig_mode_current=True)
    if request.product:
        gpus = gpus.filter(catalog_product=request.product)
    else:
        gpus = gpus.filter(catalog_product__in=_products_with_profile(request.profile_name))
    if request.cluster_id:
        gpus = gpus.filter(node__cluster_id=request.cluster_id)
    return gpus


def _nearest(request: PoolRequest, tier: str, hosts, table) -> str:
    """The profile closest to the request's that `tier` admits on the hosts' product, the next larger first:
    "4 x 3g.40gb would be served"; "" when the tier admits none."""
    product = find_product(request.product or (hosts.values_list("catalog_product", flat=True).first() or ""))
    wanted = product.by_name.get(request.profile_name) if product else None
    if product is None or wanted is None:
        return ""
    admitted = [
        p
        for p in product.profiles
        if not p.has_media_extensions and tiers.profile_allowed(tier, product.key, p.name, table)
    ]
    if not admitted:
        return ""
    best = min(
        admitted,
        key=lambda p: (
            p.compute_slices < wanted.compute_slices,
            abs(p.compute_slices - wanted.compute_slices),
            p.memory_slices,
        ),
    )
    return f"{request.count} x {best.name} would be served"


# --- Explaining a shortage ----------------------------------------------------------------------


def shortage(request: PoolRequest, free: dict[int, int]) -> tuple[str, dict]:
    """What is missing, as a sentence and as data: "need 4 x H100-80GB 3g.40gb, 1 free", the units the
    tier policy withholds and whether the request can ever be served (verdict()), plus, for MIG, whether
    reconfiguring idle MIG GPUs (capacity.mig.planner.plan_onto_gpus) would make room."""
    names = dict(Cluster.objects.filter(pk__in=free).values_list("pk", "name"))
    best = max(free, key=lambda c: (free[c], -c)) if free else None
    best_free = free.get(best, 0) if best is not None else 0
    total = sum(free.values())
    what = f"{request.count} x {unit_label(request)}"
    if topology.one_node(request):
        where = f" on {names[best]}" if best is not None else ""
        message = f"need {what} on one node, at most {best_free} free on one node{where}"
    elif may_span(request) and len(free) > 1:
        usable = usable_free(request, free)
        where = "in all" if usable == total else f"on clusters of one binding, {total} in all"
        message = f"need {what} across clusters, {usable} free {where}"
    elif len(free) > 1:
        message = f"need {what} on one cluster, at most {best_free} free on one ({names[best]}), {total} free in all"
    else:
        message = f"need {what}, {best_free} free"
    found = verdict(request, FreeUnits(free))
    if found.withheld:
        message += f"; {found.withheld_sentence()}"
    if not found.servable:
        message += f"; it can never be served: {found.refusal}"
    detail: dict = {
        "need": request.count,
        "spec": unit_label(request),
        "free": best_free,
        "free_by_cluster": {names[c]: n for c, n in sorted(free.items(), key=lambda kv: names[kv[0]])},
        "withheld": {"units": found.withheld, "reason": found.reason},
        "servable": found.servable,
        "refusal": found.refusal,
        "reconfiguration": None,
    }
    if topology.one_node(request):
        fit = topology.what_would_fit(request, full_candidates(request), full_hosts(request))
        detail["one_node"] = fit
        if fit["node"] is None:
            message += f"; no node has {request.count} such GPUs (the largest has {fit['largest']})"
        else:
            message += f"; {fit['node']} would hold it once {fit['to_release']} of its {fit['gpus']} GPUs are released"
    if request.spec_kind == SpecKind.MIG:
        hint = reconfiguration_hint(request, free)
        detail["reconfiguration"] = hint
        if hint is None:
            message += "; no MIG reconfiguration of idle GPUs would make room"
        else:
            gpus = ", ".join(hint["gpus"])
            message += (
                f"; reconfiguring GPUs {gpus} on {hint['cluster']} would free {hint['would_free']}"
                f" more ({hint['available_after']} available)"
            )
    return message, detail


def unit_label(request: PoolRequest) -> str:
    product = request.product or "any GPU"
    if request.spec_kind == SpecKind.MIG:
        return f"{request.product} {request.profile_name}".strip()
    if request.spec_kind == SpecKind.TIMESLICE:
        return f"{product} time-slice replica"
    if request.spec_kind == SpecKind.MPS:
        return f"{product} MPS replica"
    if request.spec_kind == SpecKind.VGPU:
        return f"vGPU {request.profile_name} ({product})"
    return f"{product} full GPU"


def reconfiguration_hint(request: PoolRequest, free: dict[int, int]) -> dict | None:
    """The best single-cluster MIG reconfiguration that would meet the request, or the one that gets closest.

    Allocated instances and instances with running workloads stay where they are; only the layout
    of the remaining slices may change. Returns None when no reconfiguration adds a unit.
    """
    gpus = _mig_hosts(request, GpuCapacity.objects.usable())
    gpus = gpus.filter(node__tier__in=tiers.tiers_allowing(request.product, request.profile_name))
    rows = list(gpus.select_related("node__cluster").order_by("node__cluster_id", "node_id", "index"))
    if not rows:
        return None
    instances: dict[int, list[tuple[str, int]]] = defaultdict(list)
    pinned: dict[int, set[int]] = defaultdict(set)
    instances_of_rows = MigInstance.objects.annotate_availability().filter(gpu__in=[g.pk for g in rows])
    for gpu_id, name, start, availability in instances_of_rows.values_list(
        "gpu_id", "profile__name", "placement_start", "availability"
    ):
        instances[gpu_id].append((name, start))
        if availability in (Availability.RESERVED, Availability.IN_USE, Availability.ENDING):
            pinned[gpu_id].add(start)
    groups: dict[tuple[int, str], list[GpuCapacity]] = defaultdict(list)
    for gpu in rows:
        groups[(gpu.node.cluster_id, gpu.catalog_product)].append(gpu)
    best = None
    for (cluster_id, product), members in groups.items():
        states = [GpuState(g.uuid, tuple(instances[g.pk]), frozenset(pinned[g.pk])) for g in members]
        try:
            plan = plan_onto_gpus(product, states, {request.profile_name: request.count})
        except (ValueError, KeyError):  # an inventory the catalog cannot place: no advice from it
            continue
        met = sum(plan.met.values())
        now = free.get(cluster_id, 0)
        if met <= now:
            continue
        touched = [c.gpu for c in plan.changes if c.touched]
        key = (met >= request.count, met, -len(touched))
        if best is None or key > best[0]:
            best = (
                key,
                {
                    "cluster": members[0].node.cluster.name,
                    "product": product,
                    "gpus": touched,
                    "would_free": met - now,
                    "available_after": met,
                    "meets_request": met >= request.count,
                },
            )
    return None if best is None else best[1]


def _products_with_profile(profile_name: str) -> list[str]:
    return [key for key, product in PRODUCTS.items() if profile_name in product.by_name]

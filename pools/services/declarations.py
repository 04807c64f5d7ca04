"""A request's declaration turned into the spec it stores, before anything is written.

Pinned (a profile, a tier or an isolation kind named): the spec is resolved, and memory or compute its
units cannot give is refused. Declared (needs only): matching chooses the offer and says why. Either
way a spec no unit of the fleet would ever serve under the tier policy is refused. Every refusal is a
SpecError whose `errors` map field -> message(s), which the API answers as a 400 on those fields.
"""

from __future__ import annotations

from capacity.mig.catalog import find_product

from ..choices import Isolation, IsolationNeed, WorkloadType
from ..exceptions import SpecError
from ..models import PoolRequest
from ..units import candidates, offers, refusal
from .requests import inventory_products, resolve_spec


def check_vgpu_type(attrs: dict) -> None:
    """A named vGPU type makes the declaration a VM's (sets `vm`) and must be a type discovery found."""
    name = attrs.get("vgpu_type", "")
    if not name:
        return
    cluster = attrs.get("cluster")
    offered = candidates.fleet_vgpu_types(cluster_id=cluster.pk if cluster is not None else None)
    if name not in offered:
        where = f" of {cluster.name}" if cluster is not None else ""
        listing = ", ".join(offered) or "none"
        raise SpecError({"vgpu_type": f"Unknown vGPU type {name!r}: the vm-vgpu nodes{where} offer {listing}."})
    attrs["vm"] = True


def resolve(attrs: dict) -> dict:
    """`attrs` (a request's validated fields) with the spec it stores: pinned or matched; SpecError if refused."""
    if attrs.get("vgpu_type") and is_pinned(attrs):
        raise SpecError(
            {"vgpu_type": "A vGPU type is matched for a VM: leave out profile_name, tier and isolation kind."}
        )
    check_vgpu_type(attrs)
    attrs = _pinned(attrs) if is_pinned(attrs) else _matched(attrs)
    _refuse_never_served(attrs)
    return attrs


def is_pinned(attrs: dict) -> bool:
    return bool(attrs.get("profile_name") or attrs.get("tier") or attrs.get("isolation") in Isolation.values)


def declared(attrs: dict, **override) -> dict:
    """The declaration's needs as offers.match_declared() takes them."""
    cluster = attrs.get("cluster")
    needs = {
        "workload_type": attrs.get("workload_type") or WorkloadType.INFERENCE,
        "memory_gib": attrs.get("memory_gib"),
        "compute_fraction": attrs.get("compute_fraction"),
        "isolation": attrs.get("isolation", ""),
        "count": attrs.get("count", 1),
        "product": attrs.get("product", ""),
        "cluster_id": cluster.pk if cluster is not None else None,
        "start_at": attrs.get("start_at"),
        "end_at": attrs.get("end_at"),
        "vm": attrs.get("vm", False),
        "vgpu_type": attrs.get("vgpu_type", ""),
    }
    return {**needs, **override}


def _pinned(attrs: dict) -> dict:
    """The team named the spec: resolve it, and refuse memory or compute its units cannot give."""
    spec = resolve_spec(
        isolation=attrs.get("isolation", ""),
        tier=attrs.get("tier", ""),
        workload_type=attrs.get("workload_type") or WorkloadType.INFERENCE,
        product=attrs.get("product", ""),
        profile_name=attrs.get("profile_name", ""),
        memory_gib=attrs.get("memory_gib"),
        compute_fraction=attrs.get("compute_fraction"),
    )
    if spec.spec_kind != Isolation.MIG and (attrs.get("memory_gib") or attrs.get("compute_fraction")):
        result = offers.match_declared(
            **declared(attrs, isolation=IsolationNeed.NONE, product=spec.product),
            kinds=frozenset({spec.spec_kind}),
        )
        physical = {"memory_gib", "compute_fraction"}
        if result.rejected and not any(
            not {need for need, _ in o.failures} & physical for o in result.offers + result.rejected
        ):
            raise SpecError(_errors(result, only=physical))
    attrs.update(
        isolation=spec.isolation,
        tier=spec.tier,
        spec_kind=spec.spec_kind,
        product=spec.product,
        profile_name=spec.profile_name,
        offer_reason="spec named by the team",
    )
    return attrs


def _matched(attrs: dict) -> dict:
    """The team declared needs: matching chooses the offer and says why."""
    product = attrs.get("product", "")
    if product and product not in inventory_products() and not find_product(product):
        raise SpecError({"product": f"Unknown GPU product {product!r}."})
    result = offers.match_declared(**declared(attrs))
    chosen = result.chosen
    if chosen is None:
        raise SpecError(_errors(result))
    attrs.update(
        chosen.spec(),
        declared_isolation=result.need.isolation_need,
        offer=chosen.to_dict(),
        offer_reason=result.why(),
    )
    return attrs


def _refuse_never_served(attrs: dict) -> None:
    """Refused on the profile when no unit of the fleet would ever serve the spec under the tier profile policy,
    naming the rule and the nearest offer that would be served (pools.units.refusal)."""
    draft = PoolRequest(
        spec_kind=attrs.get("spec_kind", ""),
        isolation=attrs.get("isolation", ""),
        tier=attrs.get("tier", ""),
        product=attrs.get("product", ""),
        profile_name=attrs.get("profile_name", ""),
        count=attrs.get("count", 1),
        cluster=attrs.get("cluster"),
    )
    never = refusal(draft)
    if never:
        raise SpecError({"profile_name": f"It can never be served: {never}."})


def _errors(result, only: set[str] | None = None) -> dict[str, list[str]]:
    """The refusal of a declaration no offer meets: each need that every offer fails, with each offer's reason."""
    failing = [{need for need, _ in o.failures} for o in result.rejected]
    common = set.intersection(*failing) if failing else set()
    if only is not None:
        common &= only
    if not result.rejected:
        return {"product": ["No GPU in the fleet offers units of that kind."]}
    if not common:
        return {"non_field_errors": [o.explanation() for o in result.rejected]}
    return {
        need: [f"{o.label}: {why}" for o in result.rejected for n, why in o.failures if n == need]
        for need in sorted(common)
    }

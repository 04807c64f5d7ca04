"""A request's units: what is free, how approval takes it, and what the fleet could offer.

One module per question; the units API (formerly one module, units.py) is importable from pools.units:

free        free candidates by kind and cluster, and which clusters a request draws from
take        how approval locks and takes units, inside its transaction
verdict     the one answer every screen gives about a request's units, with refusals and hints
topology    nodes and GPU locality (NVLink, PCIe, NUMA): which units sit together
specs       a declared spec resolved to a kind, tier and MIG profile
matching    a declared need matched to the offer that serves it (pure)
candidates  what the fleet offers, as matching's candidates
offers      matching against the live fleet, with prices and a start forecast
"""

from .free import (
    FULL_RESOURCE,
    TIMESLICE_RESOURCE,
    FreeUnits,
    Unit,
    choose_clusters,
    free_by_cluster,
    full_candidates,
    full_hosts,
    may_span,
    mig_candidates,
    read_free,
    read_free_to_take,
    request_vgpu,
    spread_clusters,
    timeslice_candidates,
    usable_free,
    vgpu_candidates,
)
from .take import localities, lock_clusters, take_units
from .verdict import Verdict, never_served, reconfiguration_hint, refusal, shortage, unit_label, verdict

__all__ = [
    "FULL_RESOURCE",
    "TIMESLICE_RESOURCE",
    "FreeUnits",
    "Unit",
    "Verdict",
    "choose_clusters",
    "free_by_cluster",
    "full_candidates",
    "full_hosts",
    "localities",
    "lock_clusters",
    "may_span",
    "mig_candidates",
    "never_served",
    "read_free",
    "read_free_to_take",
    "reconfiguration_hint",
    "refusal",
    "request_vgpu",
    "shortage",
    "spread_clusters",
    "take_units",
    "timeslice_candidates",
    "unit_label",
    "usable_free",
    "verdict",
    "vgpu_candidates",
]

"""Matching a declared need to the offer that serves it: the seed's "teams declare, the platform matches".

A team declares memory, compute, isolation, duration and workload type; the fleet offers kinds of
unit (a MIG profile, a time-slice replica, a whole GPU or several on one node). Every offer is
checked against every declared need, and each one that fails says why ("time-slicing (H200-141GB,
1/4): no memory isolation, you asked for isolation=hardware"). Of the offers that meet every need,
the chosen one is the cheapest in the first tier of the workload's order (TIER_ORDER: development
tries tier 3 before tier 2, training whole GPUs before MIG), so a development notebook lands on
time-slicing even where a 1g MIG slice would cost a little less, and goes to MIG only when it
declares a need time-slicing cannot meet.

Memory is checked for every kind: a MIG profile's nominal size (the number in its name), a
time-slice replica's share of its GPU (GPU memory / replicas: nothing stops a neighbour from taking
more, so the share is all a tenant can count on), a whole GPU's memory. Duration counts: a shared
tier suits a short interactive session, not an SLA service or a long training run.

`match()` is pure (no database); pools.units.candidates reads what the fleet offers and
pools.units.offers when each offer could start.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction

from capacity.choices import SpecKind, Tier
from capacity.mig.catalog import find_product
from capacity.mig.share import unit_share
from capacity.tiers import DEFAULT_POLICIES, Policy, profile_allowed, withheld_label
from capacity.vgpu import OVERHEAD_RANGE_PCT
from pricing.lookup import PriceLookup, no_price

from ..choices import IsolationNeed, WorkloadType

# A session at most this long counts as short and interactive: shared tiers suit it whatever the workload.
SHORT_SESSION_HOURS = 8

# Tiers in the order each workload type tries them (the seed's layered strategy).
TIER_ORDER: dict[str, tuple[str, ...]] = {
    WorkloadType.INFERENCE: (Tier.SLA_INFERENCE, Tier.TRAINING, Tier.STAGING, Tier.DEVELOPMENT),
    WorkloadType.STAGING: (Tier.STAGING, Tier.SLA_INFERENCE, Tier.TRAINING, Tier.DEVELOPMENT),
    WorkloadType.DEVELOPMENT: (Tier.DEVELOPMENT, Tier.STAGING, Tier.SLA_INFERENCE, Tier.TRAINING),
    WorkloadType.TRAINING: (Tier.TRAINING, Tier.STAGING, Tier.SLA_INFERENCE, Tier.DEVELOPMENT),
}
# What isolation a workload needs when the team does not say.
DEFAULT_ISOLATION: dict[str, str] = {
    WorkloadType.INFERENCE: IsolationNeed.HARDWARE,
    WorkloadType.STAGING: IsolationNeed.MEMORY,
    WorkloadType.DEVELOPMENT: IsolationNeed.NONE,
    WorkloadType.TRAINING: IsolationNeed.NONE,
}
_LEVEL = {IsolationNeed.NONE: 0, IsolationNeed.MEMORY: 1, IsolationNeed.HARDWARE: 2}
# The isolation each kind gives, and what it lacks, in words.
KIND_ISOLATION: dict[str, tuple[str, str]] = {
    SpecKind.FULL: (IsolationNeed.HARDWARE, ""),
    SpecKind.MIG: (IsolationNeed.HARDWARE, ""),
    SpecKind.TIMESLICE: (IsolationNeed.NONE, "no memory isolation"),
}
# An MPS share: a replica of a node whose device plugin shares through MPS, so each client is capped at
# memory / replicas and 100 / replicas % of the SMs (no one starves the others). Its own unit kind and price.
MPS = SpecKind.MPS
KIND_ISOLATION[MPS] = (IsolationNeed.NONE, "no memory isolation (MPS caps each client, but faults are shared)")
# A vGPU: a VM's share of a GPU (KubeVirt, vm-vgpu nodes): dedicated framebuffer, time-sliced compute.
VGPU = SpecKind.VGPU
KIND_ISOLATION[VGPU] = (IsolationNeed.MEMORY, "time-sliced compute: no compute isolation")
# Shared without limits: a long run starves the GPU's other tenants.
SHARED_KINDS = frozenset({SpecKind.TIMESLICE})
# On equal tier and price, the kind that isolates more wins.
KIND_ORDER = (SpecKind.FULL, SpecKind.MIG, VGPU, MPS, SpecKind.TIMESLICE)


@dataclass(frozen=True)
class Need:
    """What a team declared. `hours` None means open-ended; `isolation` "" means the workload's default."""

    workload_type: str = WorkloadType.INFERENCE
    memory_gib: int | None = None
    compute_fraction: Decimal | None = None
    isolation: str = ""
    hours: float | None = None
    count: int = 1
    product: str = ""
    vm: bool = False  # the workload is a virtual machine (KubeVirt): only vGPUs serve it

    @property
    def isolation_need(self) -> str:
        return self.isolation or DEFAULT_ISOLATION.get(self.workload_type, IsolationNeed.HARDWARE)

    @property
    def short_session(self) -> bool:
        return self.hours is not None and self.hours <= SHORT_SESSION_HOURS

    def tier_order(self) -> tuple[str, ...]:
        """The workload's tier order; a short session that needs no isolation tries the shared tier first."""
        order = TIER_ORDER.get(self.workload_type, TIER_ORDER[WorkloadType.INFERENCE])
        if self.short_session and self.isolation_need == IsolationNeed.NONE:
            order = (Tier.DEVELOPMENT, *(t for t in order if t != Tier.DEVELOPMENT))
        return order

    @classmethod
    def from_request(cls, *, start_at: dt.datetime | None, end_at: dt.datetime | None, **declared) -> Need:
        hours = None
        if end_at is not None:
            hours = (end_at - (start_at or end_at)).total_seconds() / 3600
        return cls(hours=hours, **declared)


@dataclass(frozen=True)
class Candidate:
    """A kind of unit the fleet offers: memory per unit in GiB, compute as a share of one GPU."""

    kind: str
    product: str
    memory_gib: Fraction
    compute: Fraction
    profile_name: str = ""
    replicas: int = 1
    gpus_per_node: int = 1  # whole GPUs: the most one node of this product carries

    def tier(self, workload_type: str) -> str:
        if self.kind == SpecKind.MIG:
            return Tier.SLA_INFERENCE if workload_type == WorkloadType.INFERENCE else Tier.STAGING
        if self.kind in SHARED_KINDS or self.kind == MPS:
            return Tier.DEVELOPMENT
        if self.kind == VGPU:
            return Tier.STAGING
        return Tier.TRAINING

    @property
    def label(self) -> str:
        if self.kind == SpecKind.MIG:
            return f"MIG {self.profile_name} ({self.product})"
        if self.kind == SpecKind.TIMESLICE:
            return f"time-slicing ({self.product}, 1/{self.replicas})"
        if self.kind == MPS:
            return f"MPS ({self.product}, 1/{self.replicas})"
        if self.kind == VGPU:
            return f"vGPU {self.profile_name} ({self.product})"
        return f"full GPU ({self.product})"

    @property
    def spec_kind(self) -> str:
        return self.kind

    @property
    def share(self) -> Fraction:
        if self.kind == VGPU:
            return Fraction(1, self.replicas)
        return unit_share(self.spec_kind, self.product, self.profile_name, replicas=self.replicas)


@dataclass
class Offer:
    """A candidate measured against a need: what it would take, cost, and why it does or does not fit."""

    candidate: Candidate
    tier: str
    units: int
    gpus_per_unit: int
    unit_price: Decimal | None
    failures: list[tuple[str, str]] = field(default_factory=list)  # (the declared need, why it is not met)
    note: str = ""
    forecast_start: dt.datetime | None = None
    forecast: str = ""

    @property
    def meets(self) -> bool:
        return not self.failures

    @property
    def reasons(self) -> list[str]:
        return [why for _, why in self.failures]

    def explanation(self) -> str:
        return f"{self.label}: {'; '.join(self.reasons)}"

    @property
    def hourly_price(self) -> Decimal | None:
        return None if self.unit_price is None else self.unit_price * self.gpus_per_unit * self.units

    @property
    def gpu_share(self) -> Fraction:
        return self.candidate.share * self.gpus_per_unit * self.units

    @property
    def label(self) -> str:
        if self.gpus_per_unit > 1 or (self.candidate.kind == SpecKind.FULL and self.units > 1):
            return f"{self.gpus_per_unit * self.units} x {self.candidate.label} on one node"
        return self.candidate.label

    def spec(self) -> dict:
        """The PoolRequest fields this offer sets."""
        c = self.candidate
        return {
            "spec_kind": c.spec_kind,
            "isolation": c.kind,
            "tier": self.tier,
            "product": c.product,
            "profile_name": c.profile_name,
            "count": self.units * self.gpus_per_unit,
        }

    def to_dict(self) -> dict:
        c = self.candidate
        return {
            "offer": self.label,
            "kind": c.kind,
            "tier": self.tier,
            "product": c.product,
            "profile_name": c.profile_name,
            "replicas": c.replicas,
            "units": self.units * self.gpus_per_unit,
            "memory_gib_per_unit": float(round(c.memory_gib * self.gpus_per_unit, 1)),
            "compute_per_unit": float(round(c.compute * self.gpus_per_unit, 3)),
            "isolation": KIND_ISOLATION[c.kind][0],
            "note": self.note,
            "unit_hourly_price": None if self.unit_price is None else str(self.unit_price),
            "hourly_price": None if self.hourly_price is None else str(self.hourly_price),
            "gpu_share": float(round(self.gpu_share, 4)),
            "forecast_start": self.forecast_start.isoformat() if self.forecast_start else None,
            "forecast": self.forecast,
            "reasons": [{"need": need, "reason": why} for need, why in self.failures],
        }


@dataclass
class Match:
    need: Need
    offers: list[Offer]  # meeting every need, best first
    rejected: list[Offer]

    @property
    def chosen(self) -> Offer | None:
        return self.offers[0] if self.offers else None

    def why(self) -> str:
        """The chosen offer and, in one line each, why the others were not chosen."""
        if self.chosen is None:
            return "No offer meets the request.\n" + "\n".join(o.explanation() for o in self.rejected)
        order = " > ".join(self.need.tier_order())
        lines = [
            f"chose {self.chosen.label}: meets every declared need; cheapest in the first tier"
            f" {self.need.workload_type} work tries (tiers {order})"
        ]
        lines += [f"{o.label}: ranked lower ({_lower(self.chosen, o)})" for o in self.offers[1:]]
        lines += [o.explanation() for o in self.rejected]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "declared": {
                "vm": self.need.vm,
                "workload_type": self.need.workload_type,
                "memory_gib": self.need.memory_gib,
                "compute_fraction": None if self.need.compute_fraction is None else str(self.need.compute_fraction),
                "isolation": self.need.isolation_need,
                "hours": self.need.hours,
                "count": self.need.count,
                "product": self.need.product,
            },
            "chosen": self.chosen.to_dict() if self.chosen else None,
            "offers": [o.to_dict() for o in self.offers],
            "rejected": [o.to_dict() for o in self.rejected],
        }


def _lower(chosen: Offer, other: Offer) -> str:
    if other.tier != chosen.tier:
        return f"tier {other.tier} comes after tier {chosen.tier} for this workload"
    return "costs more" if other.hourly_price != chosen.hourly_price else "isolates less"


def match(
    need: Need,
    candidates: Iterable[Candidate],
    *,
    price: PriceLookup = no_price,
    policy_table: dict[str, Policy] | None = None,
) -> Match:
    """Every candidate measured against `need`; those meeting every need ranked (see the module docstring).

    `policy_table` is the tiers' MIG profile policy (capacity.tiers.policies(); default: the seed's).
    """
    order = need.tier_order()
    offers: list[Offer] = []
    for candidate in candidates:
        if need.product and not _same_product(need.product, candidate.product):
            continue
        offers.append(_measure(need, candidate, price, policy_table))
    meeting = [o for o in offers if o.meets]
    priced = all(o.hourly_price is not None for o in meeting)
    meeting.sort(
        key=lambda o: (
            order.index(o.tier) if o.tier in order else len(order),
            o.hourly_price if priced else o.gpu_share,
            KIND_ORDER.index(o.candidate.kind),
            o.candidate.product,
            o.candidate.profile_name,
            o.candidate.replicas,
        )
    )
    rejected = sorted(
        (o for o in offers if not o.meets),
        key=lambda o: (KIND_ORDER.index(o.candidate.kind), o.candidate.product, o.gpu_share, o.candidate.replicas),
    )
    return Match(need, meeting, rejected)


def _same_product(asked: str, product: str) -> bool:
    found = find_product(asked)
    return product in {asked, found.key if found else asked}


def _measure(need: Need, c: Candidate, price, policy_table) -> Offer:
    tier = c.tier(need.workload_type)
    gpus_per_unit = 1
    memory = need.memory_gib
    if c.kind == SpecKind.FULL and memory and memory > c.memory_gib and need.workload_type == WorkloadType.TRAINING:
        gpus_per_unit = math.ceil(Fraction(memory) / c.memory_gib)  # training spreads a model over GPUs
    offer = Offer(c, tier, need.count, gpus_per_unit, price(c.spec_kind, c.product, c.profile_name, c.replicas))
    reject = offer.failures.append

    if memory and memory > c.memory_gib * gpus_per_unit:
        if c.kind == MPS:
            reject(("memory_gib", f"each client is capped at {_gib(c.memory_gib)} GiB, you asked for {memory} GiB"))
        elif c.kind == SpecKind.TIMESLICE:
            reject(
                (
                    "memory_gib",
                    f"a replica's share of the GPU's memory is {_gib(c.memory_gib)} GiB"
                    f" ({_gib(c.memory_gib * c.replicas)} GiB / {c.replicas}), you asked for {memory} GiB",
                )
            )
        elif c.kind == SpecKind.MIG:
            reject(("memory_gib", f"offers {_gib(c.memory_gib)} GiB, you asked for {memory} GiB"))
        elif c.kind == VGPU:
            reject(("memory_gib", f"has a {_gib(c.memory_gib)} GB framebuffer, you asked for {memory} GiB"))
        else:
            reject(("memory_gib", f"one GPU has {_gib(c.memory_gib)} GiB, you asked for {memory} GiB"))
    if need.compute_fraction is not None and c.compute * gpus_per_unit < Fraction(need.compute_fraction):
        if c.kind == SpecKind.TIMESLICE:
            why = (
                f"a replica gets 1/{c.replicas} of the GPU's compute on average, with no guarantee;"
                f" you asked for {need.compute_fraction}"
            )
        elif c.kind == MPS:
            why = f"each client is capped at {100 // c.replicas}% of the SMs; you asked for {need.compute_fraction}"
        else:
            why = f"gives {_frac(c.compute)} of a GPU's compute, you asked for {need.compute_fraction}"
        reject(("compute_fraction", why))
    if need.vm and c.kind != VGPU:
        reject(("vm", "a virtual machine gets its GPU as a vGPU (KubeVirt on vm-vgpu nodes)"))
    if c.kind == VGPU:
        if not need.vm:
            reject(("vm", "vGPUs serve virtual machines (KubeVirt); declare vm=true for a VM workload"))
        low, high = OVERHEAD_RANGE_PCT
        offer.note = (
            f"dedicated {_gib(c.memory_gib)} GB framebuffer, compute time-sliced 1/{c.replicas} when all vGPUs"
            f" are busy, {low}-{high}% slower than bare metal; price includes the vGPU licence"
        )
    level, lacking = KIND_ISOLATION[c.kind]
    if _LEVEL[level] < _LEVEL[need.isolation_need]:
        reject(("isolation", f"{lacking}, you asked for isolation={need.isolation_need}"))
    if c.kind in SHARED_KINDS:
        why = _shared_duration(need)
        if why:
            reject(("end_at", why))
        offer.note = "shared compute and memory: a neighbour can slow you down or take memory"
    if c.kind == MPS:
        offer.note = f"capped at {_gib(c.memory_gib)} GiB and {100 // c.replicas}% of the SMs; faults are shared"
    if c.kind == SpecKind.MIG:
        table = DEFAULT_POLICIES if policy_table is None else policy_table  # match() stays pure
        if not profile_allowed(tier, c.product, c.profile_name, table):
            reject(("tier", withheld_label(tier, table)))
        if need.workload_type == WorkloadType.TRAINING and need.count > 1:
            reject(
                ("count", "MIG instances cannot talk to each other over NVLink; multi-unit training needs whole GPUs")
            )
    if c.kind == SpecKind.FULL:
        total = gpus_per_unit * need.count
        if total > 1 and total > c.gpus_per_node:
            reject(("count", f"needs {total} GPUs on one node, the largest {c.product} node has {c.gpus_per_node}"))
        if total > 1:
            offer.note = f"{total} GPUs on one node, NVLink-connected where the node has NVLink"
    return offer


def _shared_duration(need: Need) -> str:
    if need.workload_type == WorkloadType.DEVELOPMENT:
        return ""
    if need.short_session:
        return ""
    how_long = "open-ended" if need.hours is None else f"{need.hours:g} h"
    if need.workload_type == WorkloadType.TRAINING:
        return (
            f"a training run ({how_long}) would starve the GPU's other tenants;"
            f" shared tiers suit sessions up to {SHORT_SESSION_HOURS} h"
        )
    return (
        f"no performance guarantee for a long-running {need.workload_type} service ({how_long});"
        f" shared tiers suit short interactive sessions (up to {SHORT_SESSION_HOURS} h)"
    )


def _gib(value: Fraction) -> str:
    return f"{float(value):g}" if value.denominator == 1 else f"{float(value):.1f}"


def _frac(value: Fraction) -> str:
    return f"{value.numerator}/{value.denominator}" if value.denominator != 1 else str(value.numerator)

"""Do the screens agree on availability? Every profile on every node, as each screen says it.

For each cluster this reads the node view (every page) and the dashboard's cluster card, then asks,
for each kind of unit its nodes carry (a MIG profile on the nodes of one tier, or whole GPUs), a probe
request of one unit pinned to that cluster, product, profile and tier, what

- the form's availability check (project_views' check, units.verdict),
- the API's dry run (offers.match_declared, then the chosen offer's start forecast),
- the forecast (forecast.plan: free now, and the units withheld),
- approval (units.take_units inside a transaction that is rolled back: nothing is written)

say, and compares it with what the node view shows for the same units: the number Available (approval
could give them out now) and, when units are "Withheld by tier policy", the same words. contradictions()
returns one entry per disagreement, [] when every screen agrees. The browser test walks the same
screens; `bench demo-soak` samples it each round (its `contradictions` field) from the operator's
`/admin/dashboard/crosscheck.json` (`{"contradictions": <count>, "items": [...]}`).

Approval's answer is its own locking read (units.take_units): on PostgreSQL the probe's units are
row-locked (SKIP LOCKED) for the length of that read and then released by the rollback, so an approval
running at that instant steps around them as it would around another approval's.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from capacity.choices import SpecKind, Tier
from capacity.models import Cluster, GpuCapacity
from pools import units
from pools.choices import Isolation, IsolationNeed, WorkloadType
from pools.models import PoolRequest
from scheduling import forecast, offers

from . import fleet, nodes, projects
from .status import UnitStatus

# The workload whose dry run lands MIG offers on each tier (pools.units.matching.Candidate.tier).
DRY_RUN_WORKLOAD = {Tier.SLA_INFERENCE: WorkloadType.INFERENCE, Tier.STAGING: WorkloadType.STAGING}
FULL_PROFILE = "full GPU"


@dataclass
class Shown:
    """What the node view shows for one kind of unit on one cluster and tier."""

    nodes: set[str] = field(default_factory=set)
    withheld_labels: set[str] = field(default_factory=set)
    uuids: dict[str, str] = field(default_factory=dict)  # unit uuid -> status


def contradictions(clusters=None) -> list[dict]:
    """Every disagreement between the dashboard, the node view, the form's check, the dry run, the forecast and
    approval about the availability of each profile on each node; [] when they all agree. Writes nothing."""
    found: list[dict] = []
    for cluster in clusters if clusters is not None else Cluster.objects.order_by("name"):
        found += _cluster_contradictions(cluster)
    return found


def _entry(cluster, key, source: str, says, expected, nodes_: set[str]) -> dict:
    tier, product, profile = key
    where = f"{product} {profile} on tier {tier or '(none)'} nodes {', '.join(sorted(nodes_))} of {cluster.name}"
    return {
        "cluster": cluster.name,
        "nodes": sorted(nodes_),
        "tier": tier,
        "product": product,
        "profile": profile,
        "source": source,
        "says": says,
        "node_view_says": expected,
        "message": f"{where}: {source} says {says!r}, the node view {expected!r}",
    }


def _node_view(cluster: Cluster) -> tuple[dict[tuple, Shown], Counter, list[dict]]:
    """({(tier, product, profile): Shown}, units by status over all pages, the pages' profile rows)."""
    shown: dict[tuple, Shown] = defaultdict(Shown)
    statuses: Counter = Counter()
    pages = []
    tiers_ = dict(cluster.nodes.values_list("name", "tier"))  # the node view shows the tier's label
    number, last = 1, 1
    while number <= last:
        page = nodes.node_view(cluster, number)
        pages.append(page)
        last = page["page"]["pages"]
        number += 1
        for node in page["nodes"]:
            tier = tiers_.get(node["name"], "")
            for gpu in node["gpus"]:
                product = gpu["catalog_product"] or gpu["product"]
                units_ = [(i["profile"], i) for i in gpu["instances"]]
                if gpu["unit"]:
                    units_.append((FULL_PROFILE, gpu["unit"] | {"uuid": gpu["uuid"]}))
                for profile, unit in units_:
                    entry = shown[(tier, product, profile)]
                    entry.nodes.add(node["name"])
                    entry.uuids[unit["uuid"]] = unit["status"]
                    statuses[unit["status"]] += 1
                    if unit["status"] == UnitStatus.TIER_POLICY:
                        entry.withheld_labels.add(unit["availability_label"])
    return shown, statuses, pages


def _probe(cluster: Cluster, tier: str, product: str, profile: str) -> PoolRequest:
    if profile == FULL_PROFILE:
        kind, isolation, profile_name = SpecKind.FULL, Isolation.FULL, ""
    else:
        kind, isolation, profile_name = SpecKind.MIG, Isolation.MIG, profile
    return PoolRequest(
        spec_kind=kind,
        isolation=isolation,
        tier=tier,
        product=product,
        profile_name=profile_name,
        count=1,
        cluster=cluster,
        workload_type=DRY_RUN_WORKLOAD.get(tier, WorkloadType.TRAINING),
    )


def node_view_figure(cluster: Cluster, shown: dict[tuple, Shown], tier: str, product: str, profile: str):
    """(units approval could take, units withheld, their labels, the nodes) for one unit of `profile` on the
    nodes of `tier`, by the node view reading `shown`; None for whole GPUs approval never hands out as such
    (time-sliced, vGPU or MIG-tier nodes)."""
    hosts = None
    if profile == FULL_PROFILE:
        hosts = set(units.full_hosts(_probe(cluster, tier, product, profile)).values_list("uuid", flat=True))
        if not hosts:
            return None
    return _expected(shown, tier, product, profile, hosts)


def _expected(shown: dict[tuple, Shown], tier: str, product: str, profile: str, hosts: set[str] | None):
    """(units approval could take, units withheld, their labels) by the node view: units on nodes of the
    probe's tier and untiered nodes (where approval draws from), whole GPUs only on approval's hosts."""
    available, withheld, labels, nodes_ = 0, 0, set(), set()
    for t in {tier, Tier.NONE}:
        entry = shown.get((t, product, profile))
        if entry is None:
            continue
        nodes_ |= entry.nodes
        for uuid, status in entry.uuids.items():
            if hosts is not None and uuid not in hosts:
                continue
            available += status == UnitStatus.AVAILABLE
            withheld += status == UnitStatus.TIER_POLICY
        labels |= entry.withheld_labels
    return available, withheld, labels, nodes_


def _cluster_contradictions(cluster: Cluster) -> list[dict]:
    found: list[dict] = []
    shown, statuses, pages = _node_view(cluster)
    # The dashboard's cluster card counts the same units by status as the node view's tiles.
    (card,) = fleet.cluster_cards([cluster], fleet.unit_groups([cluster.pk]))
    for status in UnitStatus.values:
        says = card["units"][status]
        if says != statuses[status]:
            found.append(_entry(cluster, ("*", "*", "*"), f"dashboard ({status})", says, statuses[status], {"(all)"}))
    totals = Counter()
    for row in pages[0]["profiles"]:
        for status in UnitStatus.values:
            totals[status] += row[status]
    for status in UnitStatus.values:
        if totals[status] != statuses[status]:
            found.append(
                _entry(
                    cluster,
                    ("*", "*", "*"),
                    f"node view profile table ({status})",
                    totals[status],
                    statuses[status],
                    {"(all)"},
                )
            )
    return found + probe_contradictions(cluster, shown)


def probe_contradictions(cluster: Cluster, shown: dict[tuple, Shown]) -> list[dict]:
    """Where the form's check, the dry run, the forecast and approval disagree with `shown`, a reading of the
    cluster's node view: the server's own (_node_view) or what a browser rendered (tests/browser)."""
    found: list[dict] = []
    for tier, product, profile in sorted(_probes(shown)):
        found += _probe_contradictions(cluster, shown, tier, product, profile)
    return found


def _probes(shown: dict[tuple, Shown]) -> set[tuple[str, str, str]]:
    """One probe per kind of unit approval could hand out: a MIG profile per node tier; whole GPUs once, on the
    training tier (approval takes whole GPUs from training and untiered nodes only)."""
    probes = set()
    for tier, product, profile in shown:
        if profile != FULL_PROFILE:
            probes.add((tier, product, profile))
        elif tier in (Tier.TRAINING, Tier.NONE):
            probes.add((Tier.TRAINING, product, profile))
    return probes


def _probe_contradictions(cluster: Cluster, shown, tier: str, product: str, profile: str) -> list[dict]:
    found = []
    key = (tier, product, profile)
    probe = _probe(cluster, tier, product, profile)
    figure = node_view_figure(cluster, shown, tier, product, profile)
    if figure is None:
        return []
    available, withheld, labels, nodes_ = figure

    def differs(source: str, says, expected) -> None:
        if says != expected:
            found.append(_entry(cluster, key, source, says, expected, nodes_))

    # The form's check (what "Check availability" shows).
    checked = projects.availability_check(probe)
    form_free = next((c["free"] for c in checked["clusters"] if c["name"] == cluster.name), 0)
    differs("form check (free)", form_free, available)
    form_words = checked["message"] if not checked["enough"] else checked["withheld"]
    differs("form check (withheld reason shown)", _names_any(form_words, labels), bool(withheld))
    # The forecast: what it starts from.
    planned = forecast.plan(probe, now=timezone.now())
    differs("forecast (free now)", planned.basis["free_now"], available)
    if available < 1:
        reason = planned.basis.get("withheld", {}).get("reason", "")
        differs("forecast (withheld reason)", reason in labels if withheld else reason == "", True)
    # Approval, in a transaction rolled back: the units it would take, and the reason it would give.
    taken = _approval_would_take(probe, cluster)
    differs("approval (units it would take)", taken, available)
    if available < 1:
        message, _ = units.shortage(probe, units.free_by_cluster(probe))
        differs("approval (withheld reason in its refusal)", _names_any(message, labels), bool(withheld))
    # The API's dry run: the offer for this profile, whether the tier policy rejects it and in which words.
    found += _dry_run_contradictions(cluster, key, probe, available, labels, nodes_)
    return found


def _dry_run_contradictions(cluster, key, probe: PoolRequest, available: int, labels: set[str], nodes_) -> list[dict]:
    tier, product, profile = key
    if probe.spec_kind == SpecKind.MIG and tier not in DRY_RUN_WORKLOAD:
        return []  # no workload's dry run offers MIG on this tier
    result = offers.match_declared(
        workload_type=probe.workload_type,
        isolation=IsolationNeed.HARDWARE if probe.spec_kind == SpecKind.MIG else "",
        product=product,
        cluster_id=cluster.pk,
        forecast=False,
    )
    wanted = probe.spec_kind  # an offer's kind is its spec kind for MIG and whole GPUs
    offer = next(
        (
            o
            for o in result.offers + result.rejected
            if o.candidate.kind == wanted and o.candidate.profile_name == probe.profile_name and o.gpus_per_unit == 1
        ),
        None,
    )
    if offer is None:
        return [_entry(cluster, key, "dry run", "no such offer", "units of it on its nodes", nodes_)]
    found = []
    tier_reasons = {why for need, why in offer.failures if need == "tier"}
    if labels or tier_reasons:
        if tier_reasons != labels:
            found.append(_entry(cluster, key, "dry run (tier policy)", sorted(tier_reasons), sorted(labels), nodes_))
        return found
    if offer.meets:
        offers.forecast_start(offer, cluster_id=cluster.pk, start_at=None, workload_type=probe.workload_type)
        says_free = offer.forecast == "free now"
        if says_free != (available >= 1):
            found.append(_entry(cluster, key, "dry run (forecast)", offer.forecast, f"{available} available", nodes_))
    return found


def _approval_would_take(probe: PoolRequest, cluster: Cluster) -> int:
    """How many units approval would lock for the probe on `cluster`, as many as it can find; rolled back."""
    most = GpuCapacity.objects.present().filter(node__cluster=cluster).count() * 7 + 1
    with transaction.atomic():
        taken = units.take_units(probe, cluster.pk, most)
        transaction.set_rollback(True)
    return len(taken)


def _names_any(words: str, labels: set[str]) -> bool:
    """Do `words` name one of the withheld labels (in the sentence form units.Verdict writes them)?"""
    lowered = words.lower()
    return any(label.lower() in lowered for label in labels)

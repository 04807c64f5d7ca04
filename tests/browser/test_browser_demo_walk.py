"""The demo walked in Chromium as the operator and as the member: every screen tells one availability.

One seeded demo world (gpuaas.demo.world.seed against the simulator, minutes) is read as the screens render it:

- the operator's dashboard and node view (every cluster, every page), read from the DOM after the page fetched
  its JSON: each unit's status, the cluster cards' and profile tables' counts. For each kind of unit on each
  node tier the units the node view shows Available (and "Withheld by tier policy", with its words) are what
  the form's check, the dry run, the forecast and approval say (gpuaas.dashboard.crosscheck's probes, fed with
  the browser's reading instead of the server's); the cross-check itself and its JSON find nothing;
- the member's "Request GPUs" form: its availability check, for a free profile and a withheld one on each MIG
  tier and for a whole GPU, shows the node view's figure, as do the API's forecast and dry run for that spec;
- the dashboard's health events, idle reservations and trespass events are exactly those docs/demo.md's
  claims table announces (and the idle pools it names), after a whole trespass window of live polls.
"""

import io
import re
from collections import Counter
from datetime import timedelta

import pytest
from demo_claims import detect_all_trespass, doc_claims, doc_idle_pools, poll_all, world_claims
from django.utils import timezone

from capacity.choices import SpecKind, Tier
from capacity.models import Cluster, GpuCapacity, NodeCapacity
from gpuaas.dashboard import crosscheck
from gpuaas.dashboard.status import UnitStatus
from gpuaas.demo import world as demo_world
from monitoring.models import HealthEvent, IdleReservation
from pools.choices import Isolation, IsolationNeed, WorkloadType
from pools.services import resolve_spec
from tenancy.models import Project

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

STATUS_OF_LABEL = {
    "In Use": UnitStatus.IN_USE,
    "Ready": UnitStatus.READY,
    "Available": UnitStatus.AVAILABLE,
    "Withheld by tier policy": UnitStatus.TIER_POLICY,
    "Unavailable": UnitStatus.UNAVAILABLE,
}

# Every unit tile of the node view's grid: its node, its GPU's link, its status class and its full sentence.
READ_GRID = """() => Array.from(document.querySelectorAll('[data-region=grid] .gd-node')).flatMap(node =>
  Array.from(node.querySelectorAll('.gd-gpu')).flatMap(gpu =>
    Array.from(gpu.querySelectorAll('.gd-unit')).filter(u => !u.classList.contains('gd-st-free')).map(u => ({
      node: node.querySelector('h3').textContent,
      gpu: gpu.querySelector('.gd-gpu-head a').getAttribute('href'),
      status: Array.from(u.classList).find(c => c.startsWith('gd-st-')).slice(6),
      sentence: u.querySelector('.gd-visually-hidden').textContent,
    }))))"""

# A table as [{column header: cell text}].
READ_TABLE = """(region) => {
  const table = document.querySelector(`[data-region=${region}] table`);
  if (!table) return [];
  const heads = Array.from(table.querySelectorAll('thead th')).map(th => th.textContent);
  return Array.from(table.querySelectorAll('tbody tr')).map(tr =>
    Object.fromEntries(Array.from(tr.children).map((td, i) => [heads[i], td.textContent])));
}"""


@pytest.fixture
def demo(tmp_path, settings, monkeypatch):
    """A fresh demo world on the demo scenario's simulator, after a whole trespass window of live polls."""
    from simcluster import SimServer, load_scenario

    settings.KUBERNETES_RETRIES = 0
    monkeypatch.setattr(demo_world, "HISTORY_S", 13 * 3600)  # the idle report needs half of its 24 h window
    state = load_scenario("demo").build(mig_manager_delay=3600)
    server = SimServer(state).start()
    try:
        server.write_kubeconfigs(tmp_path)
        demo_world.seed(kube_dir=tmp_path, stdout=io.StringIO())
        now = timezone.now() + timedelta(seconds=settings.METRICS_INTERVAL_S)
        for k in range(settings.MONITORING_TRESPASS_POLLS):
            at = now + timedelta(seconds=settings.METRICS_INTERVAL_S * k)
            state.tick(settings.METRICS_INTERVAL_S)
            poll_all(at)
            detect_all_trespass(at)
        yield state
    finally:
        server.stop()


def test_the_demo_walked_as_operator_and_member(demo, browser_page, chromium):
    """One seeding (minutes), walked three ways: the operator's screens, the events, the member's form."""
    operator = browser_page
    operator.login(*demo_world.OPERATOR, admin=True)
    shown = check_the_operators_screens(operator)
    check_the_events_on_the_dashboard(operator)

    context = chromium.new_context(viewport=operator.viewport_size)  # the member's own session
    member = type(operator)(context.new_page(), operator.base_url)
    try:
        member.login(*demo_world.MEMBER, admin=False)
        check_the_members_form(member, shown)
        assert member.errors == [], member.errors
    finally:
        context.close()


def _fetched(page) -> None:
    """Re-fetch the page's JSON and wait until the DOM shows it (the first render is the inline copy)."""
    page.wait_for_selector("#gd-root[data-ready=true]")
    page.evaluate("document.querySelector('[data-region=refresh]').textContent = ''")
    page.evaluate("window.gpuaasDashboard.poll()")
    page.wait_for_function("document.querySelector('[data-region=refresh]').textContent.startsWith('Updated ')")


def _counts(text: str) -> Counter:
    """'● In Use 3 · ◐ Ready 0 · ...' -> {status: count}."""
    return Counter({STATUS_OF_LABEL[label]: int(n) for label, n in re.findall(r"([A-Z][A-Za-z ]+?) (\d+)", text)})


def _table_counts(rows: list[dict]) -> Counter:
    """A profile table's status columns summed over its rows."""
    totals = Counter()
    for row in rows:
        for head, cell in row.items():
            label = head.split(" ", 1)[-1]
            if label in STATUS_OF_LABEL:
                totals[STATUS_OF_LABEL[label]] += int(cell.replace(",", ""))
    return totals


# ---------------------------------------------------------------------------------------------------- operator


def check_the_operators_screens(page) -> dict[str, dict]:
    """Dashboard and node views as rendered agree with each other and with every screen's availability;
    returns the node view's reading per cluster ({cluster name: {(tier, product, profile): Shown}})."""
    page.go("/admin/dashboard/")
    _fetched(page)
    cards = {
        card.locator("h3").inner_text(): _counts(card.locator("p.gd-quiet").first.inner_text())
        for card in page.locator("[data-region=clusters] article").all()
    }
    overview_profiles = _table_counts(page.evaluate(READ_TABLE, "profiles"))
    clusters = list(Cluster.objects.order_by("name"))
    assert sorted(cards) == [c.name for c in clusters]

    shown_by_cluster, fleet = {}, Counter()
    for cluster in clusters:
        shown, statuses, profiles = _read_node_view(page, cluster)
        shown_by_cluster[cluster.name] = shown
        fleet += statuses
        assert +cards[cluster.name] == +statuses, (cluster.name, "dashboard card vs node view tiles")
        assert +profiles == +statuses, (cluster.name, "node view profile table vs its tiles")
        disagreements = crosscheck.probe_contradictions(cluster, shown)  # the browser's reading, every screen
        assert [d["message"] for d in disagreements] == []
    assert +overview_profiles == +fleet
    assert fleet[UnitStatus.AVAILABLE] > 0 and fleet[UnitStatus.IN_USE] > 0  # the walk saw units of each kind

    assert crosscheck.contradictions() == []
    answer = page.request.get(page.base_url + "/admin/dashboard/crosscheck.json")
    assert answer.ok and answer.json()["contradictions"] == 0, answer.text()
    return shown_by_cluster


def _read_node_view(page, cluster: Cluster):
    """The node view's tiles over every page: ({(tier, product, profile): Shown}, units by status, the profile
    table's counts)."""
    tiers = dict(NodeCapacity.objects.filter(cluster=cluster).values_list("name", "tier"))
    gpus = {gpu.pk: gpu for gpu in GpuCapacity.objects.filter(node__cluster=cluster)}
    shown, statuses, profiles = {}, Counter(), Counter()
    number, pages = 1, 1
    while number <= pages:
        page.go(f"/admin/dashboard/clusters/{cluster.pk}/?page={number}")
        _fetched(page)
        if number == 1:
            profiles = _table_counts(page.evaluate(READ_TABLE, "profiles"))
        found = re.search(r"Nodes page \d+ of (\d+)", page.inner_text("[data-region=pages]"))
        pages = int(found.group(1)) if found else 1
        for tile in page.evaluate(READ_GRID):
            gpu = gpus[int(re.findall(r"\d+", tile["gpu"])[-1])]
            unit, _, says = tile["sentence"].partition(": ")
            profile, _, placement = unit.partition(" at slice ")
            if profile == "Full GPU":
                profile, key = crosscheck.FULL_PROFILE, gpu.uuid  # approval's hosts are named by GPU uuid
            else:
                key = f"{gpu.uuid}@{placement}"
            entry = shown.setdefault(
                (tiers[tile["node"]], gpu.catalog_product or gpu.product, profile), crosscheck.Shown()
            )
            entry.nodes.add(tile["node"])
            entry.uuids[key] = tile["status"]
            statuses[tile["status"]] += 1
            if tile["status"] == UnitStatus.TIER_POLICY:
                entry.withheld_labels.add(says)
        number += 1
    return shown, statuses, profiles


# ---------------------------------------------------------------------------------------------------- events


def check_the_events_on_the_dashboard(page) -> None:
    """The open health events, idle reservations and trespass events as rendered are docs/demo.md's."""
    claims = doc_claims()
    assert world_claims() == claims
    page.go("/admin/dashboard/")
    _fetched(page)
    health = page.evaluate(READ_TABLE, "health_events")
    idle = page.evaluate(READ_TABLE, "idle_reservations")
    trespass = page.evaluate(READ_TABLE, "trespass_events")
    assert len(health) == HealthEvent.objects.filter(resolved_at__isnull=True).count() == claims["open health events"]
    assert len(idle) == IdleReservation.objects.open().count() == claims["idle reservations"]
    assert {row["Pool"] for row in idle} == doc_idle_pools()
    assert len(trespass) == claims["open trespass events"] == 0
    rules = {event.get_rule_display() for event in HealthEvent.objects.filter(resolved_at__isnull=True)}
    assert rules and {row["Rule"] for row in health} == rules, health
    assert page.inner_text("[data-region=pending]").startswith(f"{claims['requests waiting for approval']} requests")


# ---------------------------------------------------------------------------------------------------- member


def check_the_members_form(page, shown_by_cluster: dict[str, dict]) -> None:
    """The form's check, the API's forecast and dry run show the node view's figure for: a free profile and a
    withheld one on each MIG tier, and a whole GPU for training."""
    project = Project.objects.get(slug="vision")
    assert page.url.endswith(f"/projects/{project.slug}/")
    specs = _member_specs(shown_by_cluster)
    assert {"free", "withheld", "full"} <= {why for why, *_ in specs}, specs
    for why, tier, product, profile in specs:
        spec = _form_values(tier, product, profile)
        page.go(f"/projects/{project.slug}/")
        page.click("text=Request GPUs")
        for name, value in spec.items():
            if name in ("workload_type", "isolation"):
                page.select_option(f"[name={name}]", value)
            else:
                page.fill(f"[name={name}]", value)
        page.click("button[name=check]")
        page.wait_for_load_state()
        draft_tier = resolve_spec(
            isolation=spec["isolation"],
            workload_type=spec["workload_type"],
            product=product,
            profile_name=spec["profile_name"],
        ).tier
        for cluster in Cluster.objects.order_by("name"):
            figure = crosscheck.node_view_figure(cluster, shown_by_cluster[cluster.name], draft_tier, product, profile)
            _check_one(page, project, cluster, spec, (why, tier, product, profile), figure or (0, 0, set(), set()))


def _member_specs(shown_by_cluster) -> list[tuple[str, str, str, str]]:
    """(why, tier, product, profile): the first free and the first withheld MIG profile of each MIG tier the
    form reaches (crosscheck.DRY_RUN_WORKLOAD), and the first product with free whole GPUs for training."""
    chosen: dict[tuple[str, str], tuple[str, str, str, str]] = {}
    for shown in shown_by_cluster.values():
        for (tier, product, profile), entry in sorted(shown.items()):
            statuses = set(entry.uuids.values())
            if profile == crosscheck.FULL_PROFILE:
                whys = ["full"] if tier == Tier.TRAINING and UnitStatus.AVAILABLE in statuses else []
            elif tier in crosscheck.DRY_RUN_WORKLOAD:
                whys = [
                    why
                    for why, status in (("free", UnitStatus.AVAILABLE), ("withheld", UnitStatus.TIER_POLICY))
                    if status in statuses
                ]
            else:
                whys = []
            for why in whys:
                chosen.setdefault((why, tier), (why, tier, product, profile))
    return list(chosen.values())


def _form_values(tier: str, product: str, profile: str) -> dict[str, str]:
    """The form's fields for one unit of `profile` on `tier` (a workload whose spec lands on that tier)."""
    if profile == crosscheck.FULL_PROFILE:
        workload, isolation, profile = WorkloadType.TRAINING, Isolation.FULL, ""
    else:
        workload, isolation = crosscheck.DRY_RUN_WORKLOAD[tier], Isolation.MIG
    return {
        "name": "walk",
        "workload_type": workload,
        "isolation": isolation,
        "product": product,
        "profile_name": profile,
        "count": "1",
    }


def _names_a_rule(words: str, labels: set[str]) -> bool:
    """Do `words` carry a withheld label, word for word ("Withheld by tier policy (tier 1 takes 3g and larger)")?
    The form refuses a profile no unit of its tier would ever carry with the node view's own words."""
    return any(label in words for label in labels)


def _check_one(page, project, cluster, spec: dict, what: tuple, figure: tuple) -> None:
    """The form's check on the page, the API's forecast and its dry run for `spec` on `cluster` show the node
    view's figure: as many free as it shows Available, and the tier policy's rule when it withholds them all."""
    available, withheld, labels, _ = figure
    text = page.inner_text("main")
    offers = page.inner_text("[data-region=offers]") if page.locator("[data-region=offers]").count() else ""
    listed = dict(re.findall(r"^(\S+): (\d+) free$", offers, flags=re.M))
    assert int(listed.get(cluster.name, 0)) == available, (what, cluster.name, text)
    if withheld and not available:
        assert _names_a_rule(text, labels), (what, labels, text)

    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    headers = {"X-CSRFToken": csrf, "Content-Type": "application/json"}
    body = {k: v for k, v in spec.items() if v} | {"count": 1, "project": project.pk, "cluster": cluster.pk}
    forecast = page.request.post(page.base_url + "/api/v1/pool-requests/forecast/", data=body, headers=headers)
    if forecast.status == 400:  # a profile no unit of its tier would ever carry: refused with the rule
        assert not available and withheld and _names_a_rule(forecast.text(), labels), (what, forecast.text())
    else:
        assert forecast.ok, (what, forecast.status, forecast.text())
        assert forecast.json()["basis"]["free_now"] == available, (what, cluster.name, forecast.json())

    declared = {
        "workload_type": spec["workload_type"],
        "isolation": IsolationNeed.HARDWARE if spec["isolation"] == Isolation.MIG else "",
        "product": spec["product"],
        "count": 1,
        "cluster": cluster.pk,
    }
    dry = page.request.post(page.base_url + "/api/v1/pool-requests/dry-run/", data=declared, headers=headers)
    assert dry.ok, (what, dry.status, dry.text())
    result = dry.json()
    kind = SpecKind.FULL if spec["isolation"] == Isolation.FULL else SpecKind.MIG
    offer = next(
        (
            o
            for o in result["offers"] + result["rejected"]
            if o["kind"] == kind and o["profile_name"] == spec["profile_name"] and o["units"] == 1
        ),
        None,
    )
    if offer is None:
        assert not available and not withheld, (what, cluster.name, "no dry-run offer")
        return
    tier_reasons = {r["reason"] for r in offer["reasons"] if r["need"] == "tier"}
    if withheld and not available:
        assert tier_reasons == labels, (what, cluster.name, offer)
    elif available:
        assert offer["forecast"] == "free now", (what, cluster.name, offer)

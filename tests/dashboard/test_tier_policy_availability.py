"""Units the tier profile policy withholds are one state, in the same words, on every screen.

The dashboard world (dashboard_world.py) plus a tier-1 node "t1" on alpha, as the demo's prod nodes are:
GPU 0 carved 2g.20gb @0, @2 and 1g.10gb @4, @5, @6 (tier 1 takes 3g and larger: all five withheld), GPU 1
carved 3g.40gb @0, @4 (free). The seeded policy rows say tier 1 takes 3g and larger. Before, the
dashboard and node view showed the five small units "Available" while approval, the form's check and
the forecast counted none of them, and only the dry run said why.
"""

import pytest
from dashboard_world import H100, _gpu, _instance, _node
from rest_framework.test import APIClient

from capacity.models import NodeCapacity, TierProfilePolicy
from capacity.models.tiers import BUILT_IN_NOTE
from gpuaas.dashboard import crosscheck, nodes
from pools import services
from pools.exceptions import DomainError, InsufficientCapacity
from pools.models import PoolRequest
from scheduling import forecast, queue

pytestmark = pytest.mark.django_db

WITHHELD = "Withheld by tier policy (tier 1 takes 3g and larger)"
FORM_URL = "/projects/team-a/requests/new/"
FORM = {"name": "small-inference", "workload_type": "inference", "isolation": "mig", "product": "H100-80GB"}


@pytest.fixture
def tier1(world):
    t1 = _node(world.alpha, "t1", H100, 2, mig_strategy="mixed", tier="1")
    small, large = _gpu(t1, 0, H100, "H100-80GB", True), _gpu(t1, 1, H100, "H100-80GB", True)
    for name, start in (("2g.20gb", 0), ("2g.20gb", 2), ("1g.10gb", 4), ("1g.10gb", 5), ("1g.10gb", 6)):
        _instance(small, name, start)
    _instance(large, "3g.40gb", 0)
    _instance(large, "3g.40gb", 4)
    return t1


def _only_tier_1_carries_h100_mig():
    """a1 (untiered, any profile) moves to tier 2: tier 1 is then the only home of an inference 1g.10gb."""
    NodeCapacity.objects.filter(name="a1").update(tier="2")


def _draft(project, profile, count, **fields):
    return PoolRequest(
        project=project,
        spec_kind="mig",
        isolation="mig",
        tier="1",
        product="H100-80GB",
        profile_name=profile,
        count=count,
        workload_type="inference",
        **fields,
    )


# --- The state on the dashboard and the node view ----------------------------------------------------


def test_the_node_view_shows_small_units_on_tier_1_withheld_with_the_rule(client, operator, world, tier1):
    client.force_login(operator)
    data = client.get(f"/admin/dashboard/clusters/{world.alpha.pk}/data.json").json()
    (t1,) = [n for n in data["nodes"] if n["name"] == "t1"]
    shown = [(i["profile"], i["status"], i["availability_label"]) for g in t1["gpus"] for i in g["instances"]]
    assert shown == [
        ("2g.20gb", "tier_policy", WITHHELD),
        ("2g.20gb", "tier_policy", WITHHELD),
        ("1g.10gb", "tier_policy", WITHHELD),
        ("1g.10gb", "tier_policy", WITHHELD),
        ("1g.10gb", "tier_policy", WITHHELD),
        ("3g.40gb", "available", "Free"),
        ("3g.40gb", "available", "Free"),
    ]
    rows = {row["shape"]: row for row in data["profiles"]}
    assert (rows["1g"]["tier_policy"], rows["2g"]["tier_policy"], rows["2g"]["available"]) == (3, 2, 1)
    assert data["tier_policies"]["rules"] == ["tier 1 takes 3g and larger", "tier 3 takes only 1g/2g"]


def test_the_dashboard_counts_withheld_units_apart_from_available(client, operator, world, tier1):
    client.force_login(operator)
    data = client.get("/admin/dashboard/data.json").json()
    alpha = next(c for c in data["clusters"] if c["name"] == "alpha")
    # a1's free 2g.20gb and t1's two 3g.40gb are Available; t1's five small units are not.
    assert (alpha["units"]["available"], alpha["units"]["tier_policy"]) == (3, 5)
    assert data["tier_policies"]["admin_url"] == "/admin/capacity/tierprofilepolicy/"


def test_a_policy_row_edited_in_the_admin_is_what_every_screen_reads(client, operator, world, tier1):
    client.force_login(operator)
    row = TierProfilePolicy.objects.get(tier="1")
    response = client.post(
        f"/admin/capacity/tierprofilepolicy/{row.pk}/change/",
        {"tier": "1", "min_compute_slices": "1", "max_compute_slices": "8", "notes": "any size"},
    )
    assert response.status_code == 302
    alpha = next(c for c in client.get("/admin/dashboard/data.json").json()["clusters"] if c["name"] == "alpha")
    assert (alpha["units"]["available"], alpha["units"]["tier_policy"]) == (8, 0)


# --- The admin shows the policy as rows ----------------------------------------------------------------


def test_every_tier_has_a_policy_row_the_admin_lists_with_what_it_admits(client, operator):
    rows = {r.tier: r for r in TierProfilePolicy.objects.all()}
    assert set(rows) == {"1", "2", "3", "full", ""}
    assert (rows["1"].min_compute_slices, rows["1"].max_compute_slices, rows["1"].notes) == (3, 8, BUILT_IN_NOTE)
    assert (rows["3"].min_compute_slices, rows["3"].max_compute_slices) == (1, 2)
    client.force_login(operator)
    page = client.get("/admin/capacity/tierprofilepolicy/").content.decode()
    assert "5 tier profile policies" in page
    for words in ("tier 1 takes 3g and larger", "tier 3 takes only 1g/2g", "untiered nodes take every profile"):
        assert words in page
    assert "Built-in default" in page


# --- The form's check, the dry run, the forecast and approval say the same -----------------------------


def test_the_form_check_names_the_units_withheld_and_says_it_will_wait(client, bob, world, tier1):
    client.force_login(bob)
    response = client.post(FORM_URL, FORM | {"profile_name": "1g.10gb", "count": "2", "check": "1"})
    offers = response.context["offers"]
    assert offers["enough"] is False
    assert f"3 x H100-80GB 1g.10gb {WITHHELD[0].lower()}{WITHHELD[1:]}" in offers["message"]
    assert "it waits in the queue for capacity" in response.content.decode()
    assert PoolRequest.objects.filter(name="small-inference").count() == 0


def test_the_form_check_counts_only_what_approval_would_take(client, bob, world, tier1):
    client.force_login(bob)
    response = client.post(FORM_URL, FORM | {"profile_name": "2g.20gb", "count": "1", "check": "1"})
    offers = response.context["offers"]
    assert (offers["clusters"], offers["enough"]) == ([{"name": "alpha", "free": 1}], True)  # a1's, not t1's
    assert offers["withheld"] == "2 x H100-80GB 2g.20gb withheld by tier policy (tier 1 takes 3g and larger)"


def test_a_request_the_form_said_would_wait_is_queued_not_refused(client, bob, operator, world, tier1):
    client.force_login(bob)
    response = client.post(FORM_URL, FORM | {"profile_name": "1g.10gb", "count": "2", "create": "1"})
    assert response.status_code == 302
    request = PoolRequest.objects.get(name="small-inference")
    assert (request.state, request.wait_if_full) == ("queued", True)
    assert "withheld by tier policy (tier 1 takes 3g and larger)" in request.state_reason
    # The operator's Approve while capacity is still short says why, and the request keeps its place.
    with pytest.raises(InsufficientCapacity, match="withheld by tier policy"):
        queue.approve_or_queue(request, actor=operator, reason="ok")
    request.refresh_from_db()
    assert request.state == "queued"


def test_a_request_no_unit_would_ever_serve_is_refused_at_submit_with_the_nearest_offer(client, bob, world, tier1):
    _only_tier_1_carries_h100_mig()
    api = APIClient()
    api.force_authenticate(bob)
    body = {"project": world.pools["inference"].project_id, "name": "tiny", "isolation": "mig"}
    body |= {"product": "H100-80GB", "profile_name": "1g.10gb", "count": 4, "submit": True}
    response = api.post("/api/v1/pool-requests/", body, format="json")
    assert response.status_code == 400
    assert response.data == {
        "profile_name": [
            "It can never be served: Withheld by tier policy (tier 1 takes 3g and larger); 4 x 3g.40gb would be served."
        ]
    }
    client.force_login(bob)
    form = client.post(FORM_URL, FORM | {"profile_name": "1g.10gb", "count": "4", "create": "1"})
    assert form.context["form"].errors == {
        "profile_name": [
            "It can never be served: Withheld by tier policy (tier 1 takes 3g and larger); 4 x 3g.40gb would be served."
        ]
    }
    assert not PoolRequest.objects.filter(name__in=["tiny", "small-inference"]).exists()


def test_submitting_a_draft_no_unit_would_serve_is_refused(project, bob, world, tier1):
    _only_tier_1_carries_h100_mig()
    draft = services.create_request(
        project, actor=bob, spec_kind="mig", isolation="mig", tier="1", product="H100-80GB", profile_name="2g.20gb"
    )
    with pytest.raises(
        DomainError, match="Withheld by tier policy \\(tier 1 takes 3g and larger\\); 1 x 3g.40gb would be served"
    ):
        services.submit(draft, actor=bob)
    draft.refresh_from_db()
    assert draft.state == "draft"


def test_the_dry_run_rejects_small_profiles_on_tier_1_in_the_same_words(bob, world, tier1):
    api = APIClient()
    api.force_authenticate(bob)
    response = api.post(
        "/api/v1/pool-requests/dry-run/", {"workload_type": "inference", "memory_gib": 10, "product": "H100-80GB"}
    )
    assert response.status_code == 200, response.data
    rejected = {o["profile_name"]: o["reasons"] for o in response.data["rejected"] if o["kind"] == "mig"}
    assert {"need": "tier", "reason": WITHHELD} in rejected["1g.10gb"]
    assert response.data["chosen"]["profile_name"] == "3g.40gb"
    assert response.data["chosen"]["forecast"] == "free now"  # t1's 3g.40gb


def test_approval_refuses_with_the_withheld_units_named(project, operator, world, tier1):
    request = services.create_request(
        project,
        actor=operator,
        submit=True,
        spec_kind="mig",
        isolation="mig",
        tier="1",
        product="H100-80GB",
        profile_name="1g.10gb",
        count=2,
    )
    with pytest.raises(InsufficientCapacity) as refused:
        services.approve(request, actor=operator)
    assert "3 x H100-80GB 1g.10gb withheld by tier policy (tier 1 takes 3g and larger)" in refused.value.message
    assert refused.value.detail["withheld"] == {"units": 3, "reason": WITHHELD}


def test_the_forecast_names_the_withheld_units_and_never_starts_what_no_unit_would_serve(project, world, tier1):
    waits = forecast.estimate_start(_draft(project, "1g.10gb", 2))
    assert waits.basis["free_now"] == 0
    assert waits.basis["withheld"] == {"units": 3, "reason": WITHHELD}
    _only_tier_1_carries_h100_mig()
    never = forecast.estimate_start(_draft(project, "1g.10gb", 4))
    assert (never.p50, never.p90) == (None, None)
    assert (
        never.basis["why"] == "never: Withheld by tier policy (tier 1 takes 3g and larger); 4 x 3g.40gb would be served"
    )


# --- The cross-check -------------------------------------------------------------------------------------


def test_the_cross_check_finds_every_screen_in_agreement(world, tier1):
    assert crosscheck.contradictions() == []


def test_the_cross_check_reports_a_screen_that_shows_withheld_units_available(world, tier1, monkeypatch):
    """Today's defect, put back into the node view alone: its tiles call withheld units Available."""
    real = nodes.status_of
    monkeypatch.setattr(nodes, "status_of", lambda a: "available" if a == "tier_policy" else real(a))
    found = crosscheck.contradictions()
    sources = {(f["source"], f["profile"]) for f in found}
    assert ("approval (units it would take)", "1g.10gb") in sources
    assert ("form check (free)", "2g.20gb") in sources
    assert ("dashboard (available)", "*") in sources
    assert all(f["cluster"] == "alpha" for f in found)


def test_the_cross_check_reports_approval_disagreeing(world, tier1, monkeypatch):
    """Approval alone forgets the policy: it would take units every screen calls withheld."""
    from capacity.models import MigInstance
    from pools.units import take

    monkeypatch.setattr(
        take, "mig_candidates", lambda request, busy=None, fleet=False: MigInstance.objects.present().filter(
            profile__name=request.profile_name, gpu__node__cluster_id=request.cluster_id
        )
    )  # fmt: skip
    found = crosscheck.contradictions()
    assert {f["profile"] for f in found if f["source"] == "approval (units it would take)"} >= {"1g.10gb", "2g.20gb"}


def test_the_operator_reads_the_cross_check_as_json_and_a_member_does_not(client, operator, bob, world, tier1):
    client.force_login(operator)
    assert client.get("/admin/dashboard/crosscheck.json").json() == {"contradictions": 0, "items": []}
    client.force_login(bob)
    assert client.get("/admin/dashboard/crosscheck.json").status_code == 302  # to the admin's login

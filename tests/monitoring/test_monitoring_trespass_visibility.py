"""Who sees trespass events: operators everywhere (dashboard, admin, API, /metrics); a project member only the
events on its own units or by its own pods (project view, API), the other side named "another project" and
nothing that names it (no slug, namespace or pod)."""

import pytest
from django.urls import reverse
from monitoring_helpers import allocate
from prometheus_client.parser import text_string_to_metric_families

from monitoring.models import TrespassEvent
from tenancy.models import Project

pytestmark = pytest.mark.django_db


@pytest.fixture
def events(fleet, project, other_project):
    """team-b's pod on team-a's 3g.40gb, and a third project's pod on team-b's 2g.20gb."""
    allocate(project, fleet.mig_3g)
    allocate(other_project, fleet.mig_2g)
    third = Project.objects.create(name="Third", slug="third", namespace="third")
    on_a = TrespassEvent.objects.create(
        kind="foreign_pod",
        gpu=fleet.mig_gpu,
        mig_instance=fleet.mig_3g,
        unit_key=f"mig:{fleet.mig_3g.pk}",
        owner_project=project,
        project=other_project,
        namespace="team-b",
        pod_name="sneaky",
        pod_uid="u1",
    )
    elsewhere = TrespassEvent.objects.create(
        kind="foreign_pod",
        gpu=fleet.mig_gpu,
        mig_instance=fleet.mig_2g,
        unit_key=f"mig:{fleet.mig_2g.pk}",
        owner_project=other_project,
        project=third,
        namespace="third",
        pod_name="other",
        pod_uid="u2",
    )
    return on_a, elsewhere


def _api_ids(client, user) -> set[int]:
    client.force_login(user)
    response = client.get("/api/v1/monitoring/trespass-events/")
    assert response.status_code == 200
    return {row["id"] for row in response.json()["results"]}


def test_the_api_shows_a_member_only_events_on_or_by_its_projects(client, events, bob, charlie, operator):
    on_a, elsewhere = events
    assert _api_ids(client, bob) == {on_a.pk}
    assert _api_ids(client, charlie) == {on_a.pk, elsewhere.pk}  # team-b trespassed on a, was trespassed on
    assert _api_ids(client, operator) == {on_a.pk, elsewhere.pk}
    client.force_login(bob)
    assert client.get(f"/api/v1/monitoring/trespass-events/{elsewhere.pk}/").status_code == 404
    row = client.get(f"/api/v1/monitoring/trespass-events/{on_a.pk}/").json()
    assert (row["owner_project"], row["project"], row["namespace"], row["pod_name"]) == (
        "team-a",
        "another project",
        None,
        None,
    )


def test_a_member_reads_nothing_that_names_the_other_project_in_the_api(client, events, bob, charlie, fleet, project):
    """The trespassed-on owner never reads the trespasser's namespace or pod, nor the trespasser the owner's slug;
    a trespasser reads its own pod. The whole JSON is searched, list and detail alike."""
    on_a, elsewhere = events
    outsider = TrespassEvent.objects.create(  # a pod of a namespace that is no gpuaas project
        kind="foreign_pod",
        gpu=fleet.mig_gpu,
        mig_instance=fleet.mig_3g,
        unit_key=f"mig:{fleet.mig_3g.pk}",
        owner_project=project,
        namespace="kube-ops",
        pod_name="miner",
        pod_uid="u3",
    )
    client.force_login(bob)
    listed = client.get("/api/v1/monitoring/trespass-events/")
    detail = client.get(f"/api/v1/monitoring/trespass-events/{outsider.pk}/")
    for body in (listed.content.decode(), detail.content.decode()):
        for name in ("team-b", "sneaky", "kube-ops", "miner", "third", "u1", "u3"):
            assert name not in body, name
    rows = {row["id"]: row for row in listed.json()["results"]}
    assert {k: rows[outsider.pk][k] for k in ("owner_project", "project", "namespace", "pod_name")} == {
        "owner_project": "team-a",
        "project": "another project",
        "namespace": None,
        "pod_name": None,
    }

    client.force_login(charlie)  # team-b: the trespasser on team-a's unit, trespassed on by "third"
    body = client.get("/api/v1/monitoring/trespass-events/").content.decode()
    rows = {row["id"]: row for row in client.get("/api/v1/monitoring/trespass-events/").json()["results"]}
    assert (rows[on_a.pk]["owner_project"], rows[on_a.pk]["namespace"], rows[on_a.pk]["pod_name"]) == (
        "another project",
        "team-b",
        "sneaky",
    )
    assert (rows[elsewhere.pk]["project"], rows[elsewhere.pk]["namespace"], rows[elsewhere.pk]["pod_name"]) == (
        "another project",
        None,
        None,
    )
    assert "team-a" not in body and "third" not in body and '"other"' not in body


def test_operators_still_read_both_sides_in_the_api(client, events, operator):
    on_a, _ = events
    client.force_login(operator)
    row = client.get(f"/api/v1/monitoring/trespass-events/{on_a.pk}/").json()
    assert (row["owner_project"], row["project"], row["namespace"], row["pod_name"]) == (
        "team-a",
        "team-b",
        "team-b",
        "sneaky",
    )


def _trespass_panel(page: str) -> str:
    panel = page[page.index('data-region="trespass"') :]
    return panel[: panel.index("</section>")]


def test_the_project_view_lists_only_its_own_events(client, events, bob):
    client.force_login(bob)
    page = client.get(reverse("projects:list")).content.decode()
    trespass = _trespass_panel(page)
    assert "another project" in trespass
    for name in ("team-b", "sneaky", "third", "/other"):
        assert name not in trespass, name
    detail = client.get("/projects/team-a/").content.decode()
    assert "sneaky" not in detail and "team-b" not in _trespass_panel(detail)


def test_the_trespasser_reads_its_own_pod_on_its_project_view(client, events, charlie):
    client.force_login(charlie)
    page = client.get(reverse("projects:list")).content.decode()
    trespass = _trespass_panel(page)
    assert "team-b/sneaky" in trespass  # its own pod
    assert "team-a" not in trespass and "third/other" not in trespass and "third" not in trespass


def test_the_dashboard_and_metrics_are_for_operators(client, events, bob, staff_operator):
    client.force_login(bob)
    assert client.get(reverse("admin:gpuaas_dashboard_data")).status_code in (302, 403)
    assert client.get("/metrics").status_code in (401, 403)

    client.force_login(staff_operator)
    data = client.get(reverse("admin:gpuaas_dashboard_data")).json()
    assert {item["by"] for item in data["trespass_events"]["items"]} == {"team-b/sneaky", "third/other"}
    body = client.get("/metrics").content.decode()
    gauges = {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == "gpuaas_trespass_events_open"
    }
    assert gauges == {
        (("cluster", "c1"), ("kind", "foreign_pod"), ("owner", "team-a"), ("project", "team-b")): 1.0,
        (("cluster", "c1"), ("kind", "foreign_pod"), ("owner", "team-b"), ("project", "third")): 1.0,
    }
    admin_page = client.get(reverse("admin:monitoring_trespassevent_changelist"))
    assert admin_page.status_code == 200 and "sneaky" in admin_page.content.decode()


def test_real_activity_on_an_unallocated_unit_is_trespass(fleet, project):
    """Over 20 % SM (the seed's "abnormal") or memory in use, sustained over the window, on a unit nobody holds."""
    from datetime import timedelta

    from django.utils import timezone
    from monitoring_helpers import series_of, write

    from monitoring.services.trespass import detect_trespass

    allocate(project, fleet.mig_3g)
    now = timezone.now()
    for k in range(3):  # MONITORING_TRESPASS_POLLS
        ts = now - timedelta(seconds=30 * (2 - k))
        write(series_of(fleet.full_gpu), ts, sm_active=45.0, mem_used_mib=0)  # unallocated, busy
        write(series_of(fleet.mig_gpu, fleet.mig_2g), ts, sm_active=10.0, mem_used_mib=0)  # unallocated, quiet
        write(series_of(fleet.mig_gpu, fleet.mig_1g), ts, sm_active=0.0, mem_used_mib=4096)  # memory in use
        write(series_of(fleet.mig_gpu, fleet.mig_3g), ts, sm_active=90.0)  # held: its owner's business

    detect_trespass(fleet.cluster.pk, at=now)

    events = {(e.kind, e.unit_key, e.project_id) for e in TrespassEvent.objects.all()}
    assert events == {
        ("unallocated_activity", f"gpu:{fleet.full_gpu.pk}", None),
        ("unallocated_activity", f"mig:{fleet.mig_1g.pk}", None),
    }

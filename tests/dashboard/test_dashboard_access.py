"""Who may see what: the dashboard is staff only; the project view shows a member their projects only."""

import pytest

from pools.models import BestEffortRequest

pytestmark = pytest.mark.django_db


def _dashboard_urls(world):
    return [
        "/admin/dashboard/",
        "/admin/dashboard/data.json",
        f"/admin/dashboard/clusters/{world.alpha.pk}/",
        f"/admin/dashboard/clusters/{world.alpha.pk}/data.json",
        f"/admin/dashboard/gpus/{world.gpus['a1-0'].pk}/",
        f"/admin/dashboard/gpus/{world.gpus['a1-0'].pk}/data.json",
    ]


@pytest.mark.parametrize("who", ["anonymous", "bob", "alice"])
def test_dashboard_is_staff_only(client, world, bob, alice, who):
    if who != "anonymous":
        client.force_login({"bob": bob, "alice": alice}[who])
    for url in _dashboard_urls(world):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(f"/admin/login/?next={url}"), url


def test_dashboard_is_open_to_operators(client, operator, world):
    client.force_login(operator)
    for url in _dashboard_urls(world):
        assert client.get(url).status_code == 200, url


def _project_urls(world):
    inference = world.pools["inference"].pk
    return [
        "/projects/team-a/",
        f"/projects/team-a/pools/{inference}/",
        f"/projects/team-a/pools/{inference}/series.json",
    ]


def test_project_view_needs_a_login(client, world):
    for url in ["/projects/", *_project_urls(world)]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"] == f"/accounts/login/?next={url}", url


@pytest.mark.parametrize("who", ["alice", "bob", "victor"])
def test_members_of_every_role_see_their_project(client, world, alice, bob, victor, who):
    client.force_login({"alice": alice, "bob": bob, "victor": victor}[who])
    for url in _project_urls(world):
        assert client.get(url).status_code == 200, url


def test_outsider_gets_404_for_another_projects_pages(client, world, charlie):
    client.force_login(charlie)
    for url in _project_urls(world):
        assert client.get(url).status_code == 404, url
    # Their own pool, under the other project's slug: still not found.
    batch = world.pools["batch"].pk
    assert client.get(f"/projects/team-a/pools/{batch}/").status_code == 404
    assert client.get(f"/projects/team-b/pools/{batch}/").status_code == 200


def test_project_list_shows_only_the_members_projects(client, world, bob):
    client.force_login(bob)
    response = client.get("/projects/")
    assert response.status_code == 200
    assert [p.slug for p in response.context["projects"]] == ["team-a"]
    assert [c["name"] for c in response.context["pools"]] == ["training", "inference"]
    assert [r.project.slug for r in response.context["requests"]] == ["team-a", "team-a", "team-a"]
    html = response.content.decode()
    assert "team-b" not in html and "batch" not in html


def test_login_page_signs_a_member_in_to_the_project_view(client, world, bob):
    response = client.post("/accounts/login/", {"username": "bob", "password": "pw-bob-1"})
    assert (response.status_code, response["Location"]) == (302, "/")  # the front door sends each persona on
    assert client.get("/")["Location"] == "/projects/team-a/"
    assert client.get("/projects/team-a/").status_code == 200


def test_the_project_page_lists_its_best_effort_requests_and_no_one_elses(client, world, bob):
    mine = BestEffortRequest.objects.create(
        project=world.pools["inference"].project, count=2, product="A30-24GB", profile_name="1g.6gb"
    )
    BestEffortRequest.objects.create(
        project=world.pools["batch"].project, count=3, product="A30-24GB", profile_name="2g.12gb"
    )
    client.force_login(bob)
    response = client.get("/projects/team-a/")
    assert [(b.pk, b.units_held) for b in response.context["best_effort"]] == [(mine.pk, 0)]
    html = response.content.decode()
    assert "A30-24GB 1g.6gb" in html and "2g.12gb" not in html

"""A project member signs in outside the admin and sees their project only."""

import pytest
from dashboard_world import add_signals, build_world

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_browser_member_sees_only_their_project(browser_page, bob, project, other_project, charlie):
    page = browser_page
    world = build_world(project, other_project)
    add_signals(world)

    page.login("bob", "pw-bob-1", admin=False)
    assert page.url.endswith("/projects/team-a/")  # one project: the front door opens it
    assert page.locator("[data-region=pools] h3").all_inner_texts() == ["training", "inference"]
    text = page.inner_text("main")
    assert "team-b" not in text and "batch" not in text
    page.shoot("project-member")

    page.click("a:text('inference')")
    assert page.get_attribute("#gd-tab-allocation", "aria-selected") == "true"
    assert page.locator("#gd-panel-allocation tbody tr").count() == 3  # 1 node row + 2 units
    page.click("#gd-tab-monitoring")
    assert page.get_attribute("#gd-tab-monitoring", "aria-selected") == "true"
    page.wait_for_selector("[data-chart=sm_active_pct] canvas")
    page.shoot("project-pool-monitoring")

    # Another project's pool, the operator dashboard and its JSON: not for bob.
    other_pool = world.pools["batch"]
    assert page.request.get(f"{page.base_url}/projects/team-b/pools/{other_pool.pk}/").status == 404
    assert page.request.get(f"{page.base_url}/projects/team-a/pools/{other_pool.pk}/").status == 404
    denied = page.request.get(f"{page.base_url}/admin/dashboard/data.json", max_redirects=0)
    assert denied.status == 302 and "/admin/login/" in denied.headers["location"]

"""An operator approves a request from the dashboard, sees its pool card, the node view and a GPU's MIG picture."""

import pytest
from dashboard_world import add_signals, build_world

from pools import services
from pools.models import PoolRequest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def provisioning(monkeypatch):
    """Pools approval enqueues provisioning in Kubernetes: recorded here instead of sent to a broker."""
    enqueued = []
    monkeypatch.setattr(services, "enqueue_provisioning", lambda pool: enqueued.append(pool.pk))
    return enqueued


def test_browser_operator_approves_request_and_sees_pool_card(
    browser_page, operator, alice, project, other_project, provisioning
):
    page = browser_page
    world = build_world(project, other_project, pending=False)
    add_signals(world)
    request = services.create_request(
        project,
        actor=alice,
        submit=True,
        name="vision",
        product="H100-80GB",
        spec_kind="mig",
        isolation="mig",
        profile_name="2g.20gb",
        count=1,
    )

    page.login("operator", "pw-operator-1", admin=True)
    page.click("text=Open the GPU dashboard")
    page.wait_for_selector("#gd-root[data-ready=true]")
    assert page.locator("[data-region=clusters] h3").all_inner_texts() == ["alpha", "beta"]
    assert "Error: 1" in page.inner_text("[data-region=clusters] article:first-child .gd-counters")
    page.wait_for_selector("[data-chart=power_w] canvas")
    page.shoot("dashboard")

    page.click(f"[data-key=approve_selected-{request.pk}]")
    page.fill("textarea[name=reason], input[name=reason]", "capacity is there")
    page.click("input[type=submit]")
    assert "1 pool request approved." in page.inner_text("ul.messagelist")
    request.refresh_from_db()
    assert request.state == "provisioning"
    assert provisioning == [request.pool.pk]

    page.go("/projects/team-a/")
    card = page.locator(f"#gd-pool-{request.pool.pk}")
    assert card.inner_text() == "vision"
    page.shoot("project-after-approval")


def test_browser_node_view_and_mig_picture(browser_page, operator, project, other_project):
    page = browser_page
    world = build_world(project, other_project)
    add_signals(world)
    page.login("operator", "pw-operator-1", admin=True)

    page.go("/admin/dashboard/")
    page.click("[data-region=clusters] a:text('alpha')")
    page.wait_for_selector("#gd-root[data-ready=true]")
    nodes = page.locator("[data-region=grid] .gd-node h3").all_inner_texts()
    assert nodes == ["a1", "a2"]
    first_gpu = page.locator("[data-region=grid] .gd-gpu").first
    assert first_gpu.locator(".gd-unit strong").all_inner_texts() == ["3g.40gb", "3g.40gb"]
    assert "In Use" in first_gpu.inner_text() and "Ready" in first_gpu.inner_text()
    page.shoot("node-view-status")

    page.select_option("[data-control=colour]", "power_w")
    assert "350 W" in page.inner_text("[data-region=grid]")
    page.shoot("node-view-power")

    # Tabs are buttons reachable from the keyboard: arrow right moves to the table view.
    page.focus("#gd-tab-grid")
    page.keyboard.press("ArrowRight")
    assert page.get_attribute("#gd-tab-table", "aria-selected") == "true"
    assert page.is_hidden("#gd-panel-grid")
    rows = page.locator("[data-region=table] tbody tr")
    assert rows.count() == 5
    page.shoot("node-view-table")

    page.click("[data-region=table] a:text('GPU 0') >> nth=0")
    page.wait_for_selector("#gd-root[data-ready=true]")
    picture = page.locator("[data-region=picture]")
    assert picture.locator(".gd-unit strong").all_inner_texts() == ["3g.40gb", "3g.40gb"]
    assert picture.locator(".gd-ruler span").count() == 8
    assert "team-a / inference" in picture.inner_text() or "team-a" in picture.inner_text()
    page.wait_for_selector("[data-chart=sm_active_pct] canvas")
    page.shoot("gpu-mig-picture")


def test_browser_dashboard_refreshes_without_reload(browser_page, operator, project, other_project):
    page = browser_page
    world = build_world(project, other_project)
    page.login("operator", "pw-operator-1", admin=True)
    page.go("/admin/dashboard/")
    page.wait_for_selector("#gd-root[data-ready=true]")
    assert "1 request waiting" in page.inner_text("[data-region=pending]")
    page.evaluate("window.__notReloaded = true")

    PoolRequest.objects.create(project=project, name="late", spec_kind="mig", profile_name="1g.10gb", state="submitted")
    page.evaluate("window.gpuaasDashboard.poll()")
    page.wait_for_function("document.querySelector('[data-region=pending]').innerText.includes('2 requests waiting')")
    assert page.evaluate("window.__notReloaded") is True
    assert world.pending.pk is not None

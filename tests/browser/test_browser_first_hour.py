"""Issue 27's first-hour defects as a browser meets them: tab titles, the admin for a member, one unit count,
and trend charts that span their window."""

import re

import pytest
from dashboard_world import add_signals, build_world

from monitoring.models import Rollup5m

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_browser_member_sees_plain_titles_gpus_as_shares_and_no_second_login(browser_page, bob, project, other_project):
    page = browser_page
    world = build_world(project, other_project)
    page.login("bob", "pw-bob-1", admin=False)
    assert page.title() == "Team A | gpuaas"
    page.go("/projects/")
    assert page.title() == "My projects | gpuaas"
    # Two 3g.40gb of one H100 are one GPU held, half of it in use, on one GPU touched.
    inference = page.locator(f"article[aria-labelledby=gd-pool-{world.pools['inference'].pk}] .gd-stats").inner_text()
    assert re.search(r"Total GPUs\s+1\s", inference) and re.search(r"In use GPUs\s+0\.5\s", inference)
    assert re.search(r"GPUs touched\s+1 / 1", inference)

    response = page.page.goto(page.base_url + "/admin/")
    assert response.status == 403
    page.errors.remove(next(e for e in page.errors if "403" in e))  # the browser logs the expected 403
    assert page.title() == "For operators only | gpuaas"
    assert page.locator("input[name=password]").count() == 0
    page.click("text=Go to my projects")
    assert page.url.endswith("/projects/")


def test_browser_utilisation_chart_spans_the_window_from_its_first_reading(
    browser_page, operator, project, other_project
):
    page = browser_page
    add_signals(build_world(project, other_project))
    newest = Rollup5m.objects.order_by("-bucket").values_list("bucket", flat=True).first()
    Rollup5m.objects.filter(bucket__lt=newest).update(gpu_util_avg=None)  # utilisation known for one bucket only

    page.login("operator", "pw-operator-1", admin=True)
    page.go("/admin/dashboard/")
    page.wait_for_selector("[data-chart=gpu_util_pct] canvas")
    ranges = page.evaluate(
        """() => ["sm_active_pct", "gpu_util_pct"].map(key => {
             const chart = Chart.getChart(document.querySelector(`[data-chart=${key}] canvas`));
             return [chart.scales.x.min, chart.scales.x.max];
           })"""
    )
    assert ranges[0] == ranges[1]  # one time axis for every chart: the 3-hour window
    assert ranges[0][1] - ranges[0][0] == 3 * 3600 * 1000
    assert f"Utilisation readings begin at {newest:%H:%M}." in page.inner_text("[data-region=series]")

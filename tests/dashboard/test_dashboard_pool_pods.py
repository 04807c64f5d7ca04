"""The project's pool page lists which of the project's pods used which unit, and how hard (issue #25)."""

from datetime import timedelta

import pytest
from dashboard_world import _workload, add_signals
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from test_dashboard_query_counts import POOL_PAGE_MAX, SIGNALS_AGO

from capacity.models import WorkloadProfile
from monitoring.models import Sample, Series

pytestmark = pytest.mark.django_db


def _on_unit(workload, instance, *, ago=timedelta(hours=1)):
    WorkloadProfile.objects.filter(pk=workload.pk).update(device_ids=[instance.uuid], started_at=timezone.now() - ago)


@pytest.fixture
def page(world, client, bob):
    add_signals(world, now=timezone.now() - SIGNALS_AGO)
    serve = WorkloadProfile.objects.get(pod_name="serve-0")
    _on_unit(serve, world.instances["a1-0-3g@0"])
    client.force_login(bob)
    return f"/projects/team-a/pools/{world.pools['inference'].pk}/"


def test_a_member_sees_their_pods_units_and_figures_on_the_pool_page(world, client, page, other_project):
    # another project's pod on the same unit (a trespasser) is not the member's to see
    stranger = _workload(world.gpus["a1-0"], world.instances["a1-0-3g@0"], other_project, "stranger-0")
    _on_unit(stranger, world.instances["a1-0-3g@0"])

    # a raw sample after the last finished rollup: the page reads both, as monitoring's window_stats does
    series = Series.objects.get(mig_instance=world.instances["a1-0-3g@0"])
    Sample.objects.create(series=series, ts=timezone.now() - timedelta(seconds=5), sm_active=90.0, mem_used_mib=1234)

    response = client.get(page)

    (pod,) = response.context["pods"]
    assert (pod["namespace"], pod["pod"]) == ("team-a", "serve-0")
    (unit,) = pod["units"]
    assert unit["uuid"] == world.instances["a1-0-3g@0"].uuid
    # add_signals: 5-minute rollups at SM 40 % (10 samples each, no max) over the last hour; the raw one at 90 %
    assert 40.0 < unit["sm_active_avg"] < 90.0
    assert (unit["sm_active_max"], unit["mem_used_max_mib"]) == (90.0, 1234)
    html = response.content.decode()
    assert 'data-pod="team-a/serve-0"' in html and world.instances["a1-0-3g@0"].uuid in html
    assert "stranger-0" not in html


def test_the_page_says_when_no_pod_ran_on_the_pool(world, client, page):
    WorkloadProfile.objects.filter(pod_name="serve-0").update(device_ids=[])
    response = client.get(page)
    assert response.context["pods"] == []
    assert "No pod of this project ran on this pool" in response.content.decode()


def test_the_pods_section_is_a_constant_number_of_queries_in_the_number_of_pods(
    world, client, page, project, django_assert_max_num_queries
):
    series = Series.objects.get(mig_instance=world.instances["a1-0-3g@0"])
    Sample.objects.create(series=series, ts=timezone.now() - timedelta(seconds=5), sm_active=90.0)  # the raw tail
    client.get(page)  # warm the session and content-type caches
    # +1: with a raw sample there, the monitoring tab's own raw read (PostgreSQL: slots, then samples) is 1 more
    # than in the shared world the bound is measured on; the pods section's reads are all in the bound
    with django_assert_max_num_queries(POOL_PAGE_MAX + 1):
        client.get(page)
    with CaptureQueriesContext(connection) as one:
        assert len(client.get(page).context["pods"]) == 1
    for n in range(5):
        for key in ("a1-0-3g@0", "a1-0-3g@4"):
            _on_unit(
                _workload(world.gpus["a1-0"], world.instances[key], project, f"job-{key}-{n}"), world.instances[key]
            )
    with CaptureQueriesContext(connection) as many:
        assert len(client.get(page).context["pods"]) == 11
    assert len(many) == len(one)

"""The demo's seeded metric history continues into live polling: same model, same scale, no cliff at "now"."""

import io

import pytest

from capacity.models import NodeCapacity
from gpuaas import demo_world
from monitoring.models import Sample, Series
from monitoring.services.reports import poll_node

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("retry_waits")]


def test_seeded_history_ends_where_the_first_live_poll_begins(simcluster, settings, monkeypatch):
    settings.KUBERNETES_RETRIES = 0
    monkeypatch.setattr(demo_world, "HISTORY_S", 2 * 3600)  # the last two hours: the join at "now" is the point
    sim = simcluster("demo")
    kube_dir = next(iter(sim.kubeconfigs.values())).parent
    out = io.StringIO()
    operator, member = demo_world._users()
    clusters = demo_world._clusters(kube_dir, out)
    projects = demo_world._projects(member)
    demo_world._requests(operator, projects, clusters, out)
    demo_world._history(projects)

    seeded = {}  # series id -> its last seeded sample
    for sample in Sample.objects.order_by("ts"):
        seeded[sample.series_id] = sample
    assert len(seeded) >= 10
    for node in NodeCapacity.objects.filter(gpus__metric_series__isnull=False).distinct():
        assert poll_node(node.pk).error == ""
    live = {}
    for sample in Sample.objects.filter(ts__gt=max(s.ts for s in seeded.values())).order_by("-ts"):
        live[sample.series_id] = sample

    compared = 0
    for series_id, last in seeded.items():
        first = live[series_id]
        for column in ("sm_active", "power_w"):
            before, after = getattr(last, column), getattr(first, column)
            if before is None:
                continue
            assert after is not None, (series_id, column)
            assert 0.5 <= after / before <= 2, (Series.objects.get(pk=series_id), column, before, after)
            compared += 1
    assert compared > len(seeded)  # every series its SM activity, whole GPUs their power too
    # Held units with nothing running read idle, busy ones do not: both kinds are in the seeded day.
    sm = [s.sm_active for s in seeded.values()]
    assert min(sm) < settings.MONITORING_IDLE_SM_PCT < max(sm)

"""A fresh demo world (the seeding `manage.py demo` runs, without web, worker or beat) is what docs/demo.md says.

docs/demo.md's claims table is read here, so the doc and the world cannot drift; the seeded history runs into
the first live polls without a cliff in any series; no trespass fires on the seeded world, and one injected
trespass shows exactly one event within one poll window.
"""

import io
from datetime import timedelta

import pytest
from demo_claims import (
    detect_all_trespass,
    doc_claims,
    doc_idle_pools,
    pods_off_their_pools,
    poll_all,
    world_claims,
)
from django.conf import settings as django_settings
from django.db.models import Count
from django.utils import timezone

from capacity.adapters.kubernetes import KubernetesClient
from capacity.models import Cluster
from gpuaas.demo import world as demo_world
from monitoring.models import IdleReservation, Sample, Series, TrespassEvent
from monitoring.services.collect import poll_slot
from pools.choices import RequestState
from pools.models import PoolRequest

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("retry_waits")]


@pytest.fixture
def world(simcluster, settings, monkeypatch):
    settings.KUBERNETES_RETRIES = 0
    monkeypatch.setattr(demo_world, "HISTORY_S", 13 * 3600)  # the idle report needs half of its 24 h window
    sim = simcluster("demo")
    kube_dir = next(iter(sim.kubeconfigs.values())).parent
    demo_world.seed(kube_dir=kube_dir, stdout=io.StringIO())
    return sim


def test_a_fresh_demo_world(world, settings):
    """One seeding (it takes minutes) read three ways: the seam first (the first live poll), then the claims of
    docs/demo.md after a whole trespass window of polls, then an injected trespass."""
    check_the_seam(world)
    check_the_claims_of_docs_demo_md(world, settings)
    check_one_injected_trespass(world, settings)


def check_the_claims_of_docs_demo_md(world, settings):
    claims = doc_claims()
    now = timezone.now() + timedelta(seconds=2 * settings.METRICS_INTERVAL_S)  # after the seam's poll
    for k in range(settings.MONITORING_TRESPASS_POLLS):  # live polls over a whole trespass window
        at = now + timedelta(seconds=settings.METRICS_INTERVAL_S * k)
        poll_all(at, world)
        detect_all_trespass(at)

    off_pools = pods_off_their_pools()
    found = world_claims()
    events = [
        (str(e), e.gpu.node.name, e.gpu.index, e.mig_instance and e.mig_instance.profile.name)
        for e in TrespassEvent.objects.open()
    ]
    assert found == claims, (off_pools, events)
    waiting = set(PoolRequest.objects.filter(state=RequestState.SUBMITTED).values_list("name", flat=True))
    assert waiting == {"vision-staging", "research-finetune"}
    idle_pools = set(IdleReservation.objects.open().values_list("allocation__pool__name", flat=True))
    assert idle_pools == doc_idle_pools() == {"vision-batch", "vision-inference"}


def check_the_seam(world):
    """Seeded history runs into the live polls without a cliff in any series."""
    units = Series.objects.count()
    # The seeded history's last slot: the newest with every unit (seeding's health poll covers two nodes only).
    slots = Sample.objects.values("ts").annotate(n=Count("series")).order_by("-ts")
    last_seeded = next(row["ts"] for row in slots if row["n"] == units)
    seeded = {s.series_id: s for s in Sample.objects.filter(ts=last_seeded)}
    live_at = timezone.now() + timedelta(seconds=django_settings.METRICS_INTERVAL_S)  # a slot of its own
    poll_all(live_at, world)
    live = {s.series_id: s for s in Sample.objects.filter(ts=poll_slot(live_at))}
    assert len(seeded) == units and live.keys() == seeded.keys()  # every unit on both sides

    def cliff(column, before, after) -> bool:
        if column == "mem_used_mib":
            return before != after  # the work placed, and the driver's reservation, do not change at the seam
        if column == "sm_active":
            return abs(after - before) > max(10.0, 0.5 * before)
        return not 0.67 <= after / before <= 1.5  # power (W), temperature (C)

    cliffs, compared = [], 0
    for sid, before in seeded.items():
        for column in ("sm_active", "mem_used_mib", "power_w", "temp_c"):
            b, a = getattr(before, column), getattr(live[sid], column)
            if b is None and a is None:
                continue
            compared += 1
            if b is None or a is None or cliff(column, b, a):
                cliffs.append((str(Series.objects.get(pk=sid)), column, b, a))
    assert cliffs == [] and compared > 2 * len(seeded)
    # Each cluster's total power (the dashboard's trend) and mean SM activity continue too.
    gpu_level = set(Series.objects.filter(mig_instance__isnull=True).values_list("id", flat=True))
    for cluster in Cluster.objects.all():
        ids = set(Series.objects.filter(gpu__node__cluster=cluster).values_list("id", flat=True)) & gpu_level
        before = sum(seeded[i].power_w for i in ids)
        after = sum(live[i].power_w for i in ids)
        assert 0.9 <= after / before <= 1.1, (cluster.name, before, after)
    # Idle units read like idle H100/H200s: the driver's reservation and the boards' idle power.
    idle_full = [
        s
        for sid, s in live.items()
        if sid in gpu_level and s.sm_active == 0 and Series.objects.get(pk=sid).gpu.mig_mode_current is False
    ]
    assert idle_full and {round(s.power_w) for s in idle_full} <= {101, 75}
    assert {s.mem_used_mib for s in idle_full} <= {454, 700}


def check_one_injected_trespass(world, settings):
    """A pod no pool holds shows exactly one event, from the first poll of the window on."""
    prod = Cluster.objects.get(name="prod")
    now = timezone.now() + timedelta(minutes=10)
    poll_all(now, world)
    assert detect_all_trespass(now) == 0
    with KubernetesClient.for_cluster(prod) as client:
        client.create_namespace("intruder")
        body = {
            "metadata": {"name": "miner", "namespace": "intruder"},
            "spec": {
                "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "nodeSelector": {"kubernetes.io/hostname": "prod-h100-full-02"},
            },
        }
        client.create_pod("intruder", body)
    demo_world._rediscover({"prod": prod})
    for k in range(1, settings.MONITORING_TRESPASS_POLLS + 1):
        at = now + timedelta(seconds=settings.METRICS_INTERVAL_S * k)
        poll_all(at, world)
        detect_all_trespass(at)
        (event,) = TrespassEvent.objects.open()
        assert (event.kind, event.pod_name, event.gpu.node.name) == ("unallocated_pod", "miner", "prod-h100-full-02")

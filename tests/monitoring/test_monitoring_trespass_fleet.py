"""Trespass on a fleet that looks like a real one (#32): two clusters, ids that differ across tables (no GPU's id
equals any MIG instance's), pods holding several devices, time-slice replicas shared by two projects, mixed
products. Each test asserts what the product records (TrespassEvent rows, foreign seconds, eviction outcomes)."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone
from monitoring_helpers import allocate, series_of, write

from capacity.adapters import kubernetes as kube
from capacity.choices import SpecKind
from capacity.models import Cluster, GpuCapacity, MigInstance, MigProfile, NodeCapacity, WorkloadProfile
from monitoring.models import TrespassEvent
from monitoring.services import trespass
from monitoring.services.trespass import detect_trespass, evict_trespasser, foreign_seconds
from pools.models import Allocation
from tenancy.models import Project

pytestmark = pytest.mark.django_db

H100 = {"product": "NVIDIA H100 80GB HBM3", "catalog_product": "H100-80GB", "memory_mib": 81559}
A100 = {"product": "NVIDIA A100-SXM4-80GB", "catalog_product": "A100-80GB", "memory_mib": 81920}


class World:
    """west: one node, two A100s without MIG (ids 9101, 9102). east: an H100 with MIG (id 9201, instances 7301
    3g.40gb, 7302 2g.20gb, 7303 1g.10gb) and an H100 without MIG (id 9202), time-sliced. No id is shared."""

    def __init__(self):
        self.west = Cluster.objects.create(name="west", kubeconfig_path="/tmp/west.kubeconfig")
        self.east = Cluster.objects.create(name="east", kubeconfig_path="/tmp/east.kubeconfig")
        west_node = NodeCapacity.objects.create(cluster=self.west, name="w-node-01", gpu_count=2, ready=True)
        east_node = NodeCapacity.objects.create(cluster=self.east, name="e-node-07", gpu_count=2, ready=True)
        self.a100_1 = GpuCapacity.objects.create(pk=9101, node=west_node, index=0, uuid="GPU-west-0", **A100)
        self.a100_2 = GpuCapacity.objects.create(pk=9102, node=west_node, index=1, uuid="GPU-west-1", **A100)
        self.mig_gpu = GpuCapacity.objects.create(
            pk=9201, node=east_node, index=0, uuid="GPU-east-0", mig_mode_current=True, **H100
        )
        self.full = GpuCapacity.objects.create(pk=9202, node=east_node, index=1, uuid="GPU-east-1", **H100)
        self.mig_3g = self._instance(7301, "3g.40gb", 4, 2, "MIG-east-3g")
        self.mig_2g = self._instance(7302, "2g.20gb", 0, 3, "MIG-east-2g")
        self.mig_1g = self._instance(7303, "1g.10gb", 2, 9, "MIG-east-1g")
        # Project ids differ from every unit's too, and the lower id is not the first created.
        self.vision = Project.objects.create(pk=605, slug="vision", name="Vision", namespace="team-vision")
        self.acme = Project.objects.create(pk=602, slug="acme", name="Acme", namespace="team-acme")
        self.zeta = Project.objects.create(pk=609, slug="zeta", name="Zeta", namespace="team-zeta")

    def _instance(self, pk, name, start, gi_id, uuid):
        profile = MigProfile.objects.get(product="H100-80GB", name=name)
        placement = profile.valid_placements.get(start=start)
        return MigInstance.objects.create(
            pk=pk,
            gpu=self.mig_gpu,
            profile=profile,
            placement=placement,
            placement_start=start,
            placement_size=placement.size,
            gi_id=gi_id,
            ci_id=0,
            uuid=uuid,
        )

    def pod(self, cluster, project, name, device_ids=(), *, gpu=None, mig=None, namespace=None):
        return WorkloadProfile.objects.create(
            cluster=cluster,
            namespace=namespace or (project.namespace if project else "default"),
            pod_name=name,
            pod_uid=f"uid-{cluster.name}-{name}",
            device_ids=list(device_ids),
            gpu=gpu,
            mig_instance=mig,
            resource_name="nvidia.com/gpu",
            count=max(1, len(device_ids)),
            project=project,
        )


@pytest.fixture
def world():
    return World()


def _events(cluster=None):
    rows = TrespassEvent.objects.order_by("unit_key", "pod_name")
    if cluster is not None:
        rows = rows.filter(gpu__node__cluster=cluster)
    return [
        (e.kind, e.gpu_id, e.mig_instance_id, e.unit_key, e.owner_project_id, e.project_id, e.pod_name) for e in rows
    ]


def test_a_foreign_pod_on_a_mig_instance_records_the_instance_not_its_gpu(world):
    allocate(world.vision, world.mig_2g)
    allocate(world.acme, world.mig_3g)
    # acme's pod holds two devices: its own 3g and vision's 2g. Only vision's is trespass.
    world.pod(world.east, world.acme, "train-0", ["MIG-east-3g", "MIG-east-2g"])

    result = detect_trespass(world.east.pk)

    assert _events() == [("foreign_pod", 9201, 7302, "mig:7302", 605, 602, "train-0")]
    (event,) = TrespassEvent.objects.all()
    assert event.mig_instance == world.mig_2g and event.gpu == world.mig_gpu
    assert result.opened == [event.pk] and result.summary() == {"open": 1, "opened": 1, "ended": 0}


def test_a_pod_on_a_whole_gpu_records_no_instance_and_a_gpu_key(world):
    allocate(world.zeta, world.full)
    world.pod(world.east, world.acme, "whole", ["GPU-east-1"])

    detect_trespass(world.east.pk)

    assert _events() == [("foreign_pod", 9202, None, "gpu:9202", 609, 602, "whole")]


def test_time_slice_replicas_shared_by_two_projects_name_the_lower_id_as_owner(world):
    for replica, project in ((1, world.vision), (0, world.acme)):
        allocation = allocate(project, world.full)  # replica 0, moved before the next is made
        Allocation.objects.filter(pk=allocation.pk).update(kind=SpecKind.TIMESLICE, replica=replica)
    world.pod(world.east, world.vision, "own-replica", ["GPU-east-1::3"])  # a holder: no trespass
    world.pod(world.east, world.zeta, "intruder", ["GPU-east-1::5", "GPU-east-1::6"])  # one unit, one event

    result = detect_trespass(world.east.pk)

    assert _events() == [("foreign_pod", 9202, None, "gpu:9202", 602, 609, "intruder")]
    assert len(result.findings) == 1


def test_a_pod_without_a_project_on_a_held_unit_is_foreign(world):
    allocate(world.acme, world.mig_1g)
    world.pod(world.east, None, "stray", ["MIG-east-1g"], namespace="kube-system")

    detect_trespass(world.east.pk)

    assert _events() == [("foreign_pod", 9201, 7303, "mig:7303", 602, None, "stray")]


def test_unknown_device_ids_fall_back_to_the_unit_the_agent_resolved(world):
    allocate(world.acme, world.mig_3g)
    world.pod(world.east, world.vision, "nvml-only", ["MIG-gone"], gpu=world.mig_gpu, mig=world.mig_3g)
    world.pod(world.east, world.vision, "nothing-known", [])  # no device, no agent unit: nothing to say

    detect_trespass(world.east.pk)

    assert _events() == [("foreign_pod", 9201, 7301, "mig:7301", 602, 605, "nvml-only")]


def test_each_cluster_is_checked_alone(world):
    allocate(world.acme, world.a100_1)
    world.pod(world.west, world.vision, "west-intruder", ["GPU-west-0"])
    # A pod in east naming west's device is not east's to judge (east has no such unit).
    world.pod(world.east, world.vision, "confused", ["GPU-west-0"])

    assert detect_trespass(world.east.pk).findings == []
    detect_trespass(world.west.pk)

    assert _events() == [("foreign_pod", 9101, None, "gpu:9101", 602, 605, "west-intruder")]
    assert detect_trespass(999_999) is None


def test_events_stay_open_end_with_the_pod_and_only_the_cluster_s_own_end(world):
    allocate(world.acme, world.mig_2g)
    allocate(world.acme, world.a100_2)
    east_pod = world.pod(world.east, world.vision, "e", ["MIG-east-2g"])
    world.pod(world.west, world.vision, "w", ["GPU-west-1"])
    t0 = timezone.now()
    detect_trespass(world.east.pk, at=t0)
    detect_trespass(world.west.pk, at=t0)

    again = detect_trespass(world.east.pk, at=t0 + timedelta(seconds=30))
    assert (again.opened, again.ended) == ([], 0)
    assert TrespassEvent.objects.get(pod_name="e").last_seen_at == t0 + timedelta(seconds=30)

    east_pod.ended_at = t0 + timedelta(seconds=45)
    east_pod.save()
    ended = detect_trespass(world.east.pk, at=t0 + timedelta(seconds=60))

    assert ended.ended == 1
    closed = TrespassEvent.objects.get(pod_name="e")
    assert closed.ended_at == t0 + timedelta(seconds=60) and closed.last_seen_at == t0 + timedelta(seconds=30)
    assert TrespassEvent.objects.get(pod_name="w").ended_at is None


def test_an_ending_allocation_still_owns_its_unit(world):
    """An allocation released but not yet vacated still holds the unit: its project's pod is no trespass."""
    allocate(world.acme, world.mig_3g, released_at=timezone.now() - timedelta(seconds=10))
    world.pod(world.east, world.acme, "draining", ["MIG-east-3g"])

    assert detect_trespass(world.east.pk).findings == []


def test_idle_units_report_activity_but_held_or_occupied_ones_do_not(world, settings):
    settings.MONITORING_TRESPASS_POLLS = 2
    now = timezone.now().replace(microsecond=0)
    allocate(world.acme, world.mig_3g)
    world.pod(world.east, world.vision, "on-1g", ["MIG-east-1g"])
    for unit_gpu, mig in ((world.mig_gpu, world.mig_3g), (world.mig_gpu, world.mig_1g), (world.mig_gpu, world.mig_2g)):
        for k in (60, 30, 0):
            write(series_of(unit_gpu, mig), now - timedelta(seconds=k), sm_active=80.0, mem_used_mib=0)

    findings = detect_trespass(world.east.pk, at=now).findings

    assert sorted((f.kind, f.unit) for f in findings) == [
        ("unallocated_activity", (9201, 7302)),  # idle 2g: busy and nobody's
        ("unallocated_pod", (9201, 7303)),  # the pod on the 1g is the finding, not its activity
    ]
    activity = TrespassEvent.objects.get(kind="unallocated_activity")
    assert (activity.gpu_id, activity.mig_instance_id, activity.sm_active) == (9201, 7302, 80.0)


def test_activity_needs_fresh_samples_and_over_the_thresholds(world, settings):
    settings.MONITORING_TRESPASS_POLLS = 2
    settings.MONITORING_TRESPASS_SM_PCT = 20
    settings.MONITORING_TRESPASS_MEM_MIB = 256
    now = timezone.now().replace(microsecond=0)
    for k in (30, 0):
        at = now - timedelta(seconds=k)
        write(series_of(world.mig_gpu, world.mig_3g), at, sm_active=20.0, mem_used_mib=256)  # at: not over
        write(series_of(world.mig_gpu, world.mig_2g), at, sm_active=0.0, mem_used_mib=257)  # memory over
        write(series_of(world.mig_gpu, world.mig_1g), at, sm_active=21.0, mem_used_mib=None)  # SM over
    for k in (150, 120):  # busy, but the last sample is older than two intervals
        write(series_of(world.full), now - timedelta(seconds=k), sm_active=99.0, mem_used_mib=9000)

    findings = trespass.find(world.east, at=now)

    assert sorted((f.unit, f.sm_active, f.mem_used_mib) for f in findings) == [
        ((9201, 7302), 0.0, 257),
        ((9201, 7303), 21.0, None),
    ]


def test_activity_needs_every_one_of_the_last_polls(world, settings):
    settings.MONITORING_TRESPASS_POLLS = 3
    now = timezone.now().replace(microsecond=0)
    for k, sm in ((90, 0.0), (60, 90.0), (30, 90.0), (0, 90.0)):
        write(series_of(world.full), now - timedelta(seconds=k), sm_active=sm, mem_used_mib=0)
    write(series_of(world.mig_gpu, world.mig_2g), now - timedelta(seconds=30), sm_active=90.0, mem_used_mib=0)
    write(series_of(world.mig_gpu, world.mig_2g), now, sm_active=90.0, mem_used_mib=0)  # two of three

    assert [(f.unit, f.mem_used_mib) for f in trespass.find(world.east, at=now)] == [((9202, None), 0)]


def test_eviction_goes_to_new_and_still_running_trespassers_only(world, settings):
    settings.MONITORING_EVICT_TRESPASS = True
    allocate(world.acme, world.mig_2g)
    allocate(world.acme, world.mig_1g)
    world.pod(world.east, world.vision, "first", ["MIG-east-2g"])
    t0 = timezone.now()
    with mock.patch("monitoring.tasks.evict_trespass_task.delay_on_commit") as enqueued:
        first = detect_trespass(world.east.pk, at=t0)
        world.pod(world.east, world.zeta, "second", ["MIG-east-1g"])
        TrespassEvent.objects.filter(pod_name="first").update(evicted_at=t0)  # the first went
        second = detect_trespass(world.east.pk, at=t0 + timedelta(seconds=30))
    first_pk = TrespassEvent.objects.get(pod_name="first").pk
    second_pk = TrespassEvent.objects.get(pod_name="second").pk
    assert first.evicting == [first_pk]
    assert second.evicting == [second_pk]
    assert [c.args for c in enqueued.call_args_list] == [(first_pk,), (second_pk,)]


def test_a_still_running_trespasser_not_yet_evicted_is_evicted_again(world, settings):
    settings.MONITORING_EVICT_TRESPASS = True
    allocate(world.acme, world.mig_2g)
    world.pod(world.east, world.vision, "stubborn", ["MIG-east-2g"])
    t0 = timezone.now()
    with mock.patch("monitoring.tasks.evict_trespass_task.delay_on_commit"):
        detect_trespass(world.east.pk, at=t0)
        again = detect_trespass(world.east.pk, at=t0 + timedelta(seconds=30))
    assert again.evicting == [TrespassEvent.objects.get().pk] and again.opened == []


class _Client:
    def __init__(self, error=None):
        self.error = error
        self.evicted = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def evict_pod(self, namespace, name):
        self.evicted.append((namespace, name))
        if self.error is not None:
            raise self.error


def _open_event(world):
    allocate(world.acme, world.mig_2g)
    world.pod(world.east, world.vision, "blocked", ["MIG-east-2g"])
    detect_trespass(world.east.pk)
    return TrespassEvent.objects.get()


def test_a_refused_eviction_is_retried_after_the_retry_period_not_before(world):
    event = _open_event(world)
    refusing = _Client(kube.TooManyRequests("PDB blocks it", status=429))
    with mock.patch.object(kube.KubernetesClient, "for_cluster", return_value=refusing) as for_cluster:
        assert evict_trespasser(event.pk) == "refused"
        assert for_cluster.call_args.args == (world.east,)
        assert evict_trespasser(event.pk) == "skipped"  # within EVICTION_RETRY
    event.refresh_from_db()
    assert event.error == "TooManyRequests: PDB blocks it" and event.evicted_at is None
    assert refusing.evicted == [("team-vision", "blocked")]

    # Just before the retry period: still skipped; at it: tried again, and this time it works.
    now = timezone.now()
    TrespassEvent.objects.filter(pk=event.pk).update(
        eviction_attempted_at=now - trespass.EVICTION_RETRY + timedelta(seconds=30)
    )
    accepting = _Client()
    with mock.patch.object(kube.KubernetesClient, "for_cluster", return_value=accepting):
        assert evict_trespasser(event.pk) == "skipped"
        TrespassEvent.objects.filter(pk=event.pk).update(eviction_attempted_at=now - trespass.EVICTION_RETRY)
        assert evict_trespasser(event.pk) == "evicted"
    event.refresh_from_db()
    assert event.evicted_at is not None and event.error == ""
    assert accepting.evicted == [("team-vision", "blocked")]


def test_a_gone_pod_and_an_ended_event_are_not_evicted(world):
    event = _open_event(world)
    with mock.patch.object(kube.KubernetesClient, "for_cluster", return_value=_Client(kube.NotFound("no pod"))):
        assert evict_trespasser(event.pk) == "gone"
    event.refresh_from_db()
    assert event.error == "pod already gone" and event.evicted_at is None

    TrespassEvent.objects.filter(pk=event.pk).update(eviction_attempted_at=None, ended_at=timezone.now())
    client = _Client()
    with mock.patch.object(kube.KubernetesClient, "for_cluster", return_value=client):
        assert evict_trespasser(event.pk) == "skipped"
        TrespassEvent.objects.filter(pk=event.pk).update(ended_at=None, pod_name="")
        assert evict_trespasser(event.pk) == "skipped"  # activity has no pod to evict
    assert client.evicted == []


def test_foreign_seconds_are_clipped_to_the_window_and_keyed_per_unit(world):
    t0 = timezone.now().replace(microsecond=0) - timedelta(hours=2)
    start, end = t0, t0 + timedelta(hours=1)

    def event(kind, gpu, mig, started, ended, pod_uid=""):
        TrespassEvent.objects.create(
            kind=kind,
            gpu=gpu,
            mig_instance=mig,
            unit_key=trespass.unit_key((gpu.pk, mig.pk if mig else None)),
            started_at=started,
            last_seen_at=started,
            ended_at=ended,
            pod_uid=pod_uid,
        )

    event("foreign_pod", world.mig_gpu, world.mig_2g, t0 - timedelta(minutes=10), t0 + timedelta(minutes=5))
    event("foreign_pod", world.mig_gpu, world.mig_2g, t0 + timedelta(minutes=50), None)  # still open
    event("foreign_pod", world.full, None, t0 + timedelta(minutes=20), t0 + timedelta(minutes=21))
    event("unallocated_pod", world.full, None, t0, end)  # not foreign: no one's time was taken
    event("foreign_pod", world.mig_gpu, world.mig_3g, end, end + timedelta(minutes=5))  # after the window
    event("foreign_pod", world.mig_gpu, world.mig_1g, t0 - timedelta(minutes=9), t0)  # before it
    # Two overlapping events on one unit never count more than the window.
    event("foreign_pod", world.a100_1, None, t0 - timedelta(minutes=1), None, "pod-a")
    event("foreign_pod", world.a100_1, None, t0 + timedelta(minutes=1), None, "pod-b")

    units = {
        "2g": (9201, 7302),
        "3g": (9201, 7301),
        "1g": (9201, 7303),
        "full": (9202, None),
        "a100": (9101, None),
        "mig-gpu-whole": (9201, None),
    }
    assert foreign_seconds(units, start, end) == {"2g": 300 + 600, "full": 60, "a100": 3600}
    assert foreign_seconds({}, start, end) == {}


def test_a_last_sample_exactly_two_intervals_old_still_counts(world, settings):
    """The newest sample must be of this poll or the last: one exactly two intervals old is the last poll's."""
    settings.MONITORING_TRESPASS_POLLS = 2
    settings.METRICS_INTERVAL_S = 30
    now = timezone.now().replace(microsecond=0)
    for k in (75, 60):
        write(series_of(world.mig_gpu, world.mig_2g), now - timedelta(seconds=k), sm_active=90.0, mem_used_mib=0)
    for k in (76, 61):
        write(series_of(world.full), now - timedelta(seconds=k), sm_active=90.0, mem_used_mib=0)  # a second late

    assert [f.unit for f in trespass.find(world.east, at=now)] == [(9201, 7302)]


def test_freshness_is_judged_on_the_newest_sample_not_the_oldest(world, settings):
    """Four busy polls in a row, the newest of this poll: the oldest is 90 s old, which is no reason to wait."""
    settings.MONITORING_TRESPASS_POLLS = 4
    settings.METRICS_INTERVAL_S = 30
    now = timezone.now().replace(microsecond=0)
    for k in (90, 60, 30, 0):
        write(series_of(world.mig_gpu, world.mig_1g), now - timedelta(seconds=k), sm_active=50.0, mem_used_mib=0)

    assert [(f.kind, f.unit, f.sm_active) for f in trespass.find(world.east, at=now)] == [
        ("unallocated_activity", (9201, 7303), 50.0)
    ]


def test_opening_events_logs_one_warning_naming_the_cluster_and_a_quiet_poll_logs_none(world, caplog):
    allocate(world.acme, world.mig_2g)
    allocate(world.zeta, world.mig_1g)
    # One pod on two units of two other projects: two events, one warning for the poll.
    world.pod(world.east, world.vision, "greedy", ["MIG-east-2g", "MIG-east-1g"])
    t0 = timezone.now()

    with caplog.at_level("WARNING", logger="monitoring.services.trespass"):
        detect_trespass(world.east.pk, at=t0)
        assert [r.getMessage() for r in caplog.records] == ["cluster east: 2 trespass event(s) opened"]
        caplog.clear()
        again = detect_trespass(world.east.pk, at=t0 + timedelta(seconds=30))  # the same two, still open
        detect_trespass(world.west.pk, at=t0 + timedelta(seconds=30))  # nothing there
    assert again.opened == [] and caplog.records == []


def test_a_stale_or_short_series_does_not_hide_a_busy_unit_whose_series_comes_after_it(world, settings):
    settings.MONITORING_TRESPASS_POLLS = 2
    settings.METRICS_INTERVAL_S = 30
    now = timezone.now().replace(microsecond=0)
    # Series are judged in id order: the 3g's (stale) and the 2g's (one sample) come before the 1g's.
    for k in (150, 120):
        write(series_of(world.mig_gpu, world.mig_3g), now - timedelta(seconds=k), sm_active=95.0, mem_used_mib=0)
    write(series_of(world.mig_gpu, world.mig_2g), now, sm_active=95.0, mem_used_mib=0)
    for k in (30, 0):
        write(series_of(world.mig_gpu, world.mig_1g), now - timedelta(seconds=k), sm_active=70.0, mem_used_mib=0)
    assert series_of(world.mig_gpu, world.mig_3g) < series_of(world.mig_gpu, world.mig_2g)
    assert series_of(world.mig_gpu, world.mig_2g) < series_of(world.mig_gpu, world.mig_1g)

    assert [(f.kind, f.unit, f.sm_active) for f in trespass.find(world.east, at=now)] == [
        ("unallocated_activity", (9201, 7303), 70.0)
    ]


def test_find_writes_nothing_and_gives_the_same_findings_as_values(world, settings):
    """find() only reads: two calls give equal sets of findings (values, usable as set members) and no event."""
    settings.MONITORING_TRESPASS_POLLS = 2
    now = timezone.now().replace(microsecond=0)
    allocate(world.acme, world.a100_1)
    intruder = world.pod(world.west, world.vision, "intruder", ["GPU-west-0", "GPU-west-1"])
    for k in (30, 0):
        write(series_of(world.a100_2), now - timedelta(seconds=k), sm_active=40.0, mem_used_mib=0)  # occupied

    first = set(trespass.find(world.west, at=now))
    second = set(trespass.find(world.west, at=now))

    pod = {"project_id": 605, "workload_id": intruder.pk, "namespace": "team-vision", "pod_name": "intruder"}
    expected = {
        trespass.Finding("foreign_pod", (9101, None), 602, pod_uid="uid-west-intruder", **pod),
        trespass.Finding("unallocated_pod", (9102, None), None, pod_uid="uid-west-intruder", **pod),
    }
    assert first == expected and second == expected
    assert not TrespassEvent.objects.exists()


def test_a_refused_eviction_is_retried_five_minutes_after_the_attempt(world):
    """docs/monitoring.md: a refused eviction is retried after 5 minutes, not sooner."""
    event = _open_event(world)
    now = timezone.now()
    client = _Client()
    with mock.patch.object(kube.KubernetesClient, "for_cluster", return_value=client):
        TrespassEvent.objects.filter(pk=event.pk).update(eviction_attempted_at=now - timedelta(minutes=4, seconds=50))
        assert evict_trespasser(event.pk) == "skipped"
        TrespassEvent.objects.filter(pk=event.pk).update(eviction_attempted_at=now - timedelta(minutes=5, seconds=1))
        assert evict_trespasser(event.pk) == "evicted"
    assert client.evicted == [("team-vision", "blocked")]

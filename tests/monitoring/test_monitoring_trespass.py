"""Trespass under the device plugin: a pod handed another project's unit is caught within one poll."""

from unittest import mock

import pytest
import trespass_sim

from monitoring.models import TrespassEvent
from monitoring.services.trespass import detect_trespass, evict_trespasser
from monitoring.tasks import evict_trespass_task
from simcluster.scheduler import assigned_devices

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = trespass_sim.start(tmp_path)
    yield sim
    sim.server.stop()


def _devices(sim, pod: dict) -> str:
    """The devices the simulated kubelet gave the pod, comma separated (what its PodResources lists)."""
    with sim.state.lock:
        return ",".join(assigned_devices(sim.sim_cluster, pod["metadata"]["namespace"], pod["metadata"]["name"]))


def test_a_pod_given_another_projects_instance_opens_an_event_within_one_poll(sim):
    sim.run_pod("team-acme", "ok-1")
    sim.run_pod("team-acme", "ok-2")  # the device plugin binds by count: the second gets vision's unit
    sim.discover()

    result = detect_trespass(sim.cluster.pk)

    (event,) = TrespassEvent.objects.all()
    assert result.opened == [event.pk]
    assert event.kind == "foreign_pod" and event.is_open
    assert (event.project, event.owner_project) == (sim.acme, sim.vision)
    assert event.mig_instance == sim.instance(4)
    assert event.namespace == "team-acme" and event.pod_name in ("ok-1", "ok-2")
    assert _devices(sim, sim.pod("team-acme", event.pod_name)) == sim.instance(4).uuid


def test_the_event_stays_open_while_it_lasts_and_ends_with_the_pod(sim):
    sim.run_pod("team-acme", "ok-1")
    sim.run_pod("team-acme", "ok-2")
    sim.discover()
    detect_trespass(sim.cluster.pk)
    again = detect_trespass(sim.cluster.pk)
    assert again.opened == [] and again.ended == 0
    event = TrespassEvent.objects.get()

    sim.delete_pod("team-acme", event.pod_name)
    sim.discover()
    ended = detect_trespass(sim.cluster.pk)

    event.refresh_from_db()
    assert ended.ended == 1 and event.ended_at is not None and event.state == "closed"


def test_pods_on_their_own_units_are_no_trespass(sim):
    vision = sim.run_pod("team-vision", "theirs")  # the plugin hands out its first free device: vision's
    acme = sim.run_pod("team-acme", "mine")
    assert (_devices(sim, vision), _devices(sim, acme)) == (sim.instance(4).uuid, sim.instance(0).uuid)
    sim.discover()

    assert detect_trespass(sim.cluster.pk).findings == []
    assert not TrespassEvent.objects.exists()


def test_without_the_setting_nothing_is_evicted(sim):
    sim.run_pod("team-acme", "ok-1")
    sim.run_pod("team-acme", "ok-2")
    sim.discover()
    with mock.patch.object(evict_trespass_task, "delay_on_commit") as enqueued:
        detect_trespass(sim.cluster.pk)
    enqueued.assert_not_called()


def test_a_pod_on_an_unallocated_gpu_is_trespass_without_an_owner(sim):
    sim.run_pod("team-acme", "whole", resource="nvidia.com/gpu")
    sim.discover()

    detect_trespass(sim.cluster.pk)

    (event,) = TrespassEvent.objects.all()
    assert (event.kind, event.project, event.owner_project, event.gpu) == (
        "unallocated_pod",
        sim.acme,
        None,
        sim.gpu(1),
    )


def test_eviction_is_optional_and_goes_through_the_eviction_api(sim, settings):
    settings.MONITORING_EVICT_TRESPASS = True
    sim.run_pod("team-acme", "ok-1")
    sim.run_pod("team-acme", "ok-2")
    sim.discover()
    with mock.patch.object(evict_trespass_task, "delay_on_commit") as enqueued:
        result = detect_trespass(sim.cluster.pk)

    event = TrespassEvent.objects.get()
    assert result.evicting == [event.pk]
    enqueued.assert_called_once_with(event.pk)
    assert evict_trespasser(event.pk) == "evicted"
    assert evict_trespasser(event.pk) == "skipped"  # claimed once
    event.refresh_from_db()
    assert event.evicted_at is not None, event.error
    pod = sim.pod("team-acme", event.pod_name)
    assert pod is None or pod["metadata"].get("deletionTimestamp")


def test_in_use_follows_the_device_the_pod_got(sim):
    """acme's one pod got vision's instance: vision's unit is in use, acme's reservation is not."""
    from pools.models import Allocation

    pod = sim.run_pod("team-acme", "ok")
    assert _devices(sim, pod) == sim.instance(4).uuid
    sim.discover()

    assert list(Allocation.objects.active().in_use().values_list("project__slug", flat=True)) == ["vision"]

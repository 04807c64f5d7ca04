"""Reservations end for real (issue #25, item 2; docs/pools.md, Ending): against the simulator (device plugin,
scenario "demo"), a released, expired, reconfigured-away or idle-released unit tells its project, stays "ending"
(handed to nobody) while its pods run, and its pods are evicted after the grace period through the Eviction API,
PodDisruptionBudgets respected until the hard deadline, every attempt audited."""

from __future__ import annotations

import datetime as dt

import pytest

from capacity.choices import AllocationState, Availability
from capacity.models import MigInstance
from capacity.services.discovery import discover_cluster
from monitoring.services.trespass import owners
from pools import services
from pools.choices import EvictionOutcome, PoolState
from pools.ending import sweep_ending
from pools.models import Allocation, Eviction
from pools.signals import allocation_ending
from pools.tasks import provision_pool_task, sweep_ending_task

pytestmark = [pytest.mark.django_db(transaction=False)]
MIG = "nvidia.com/mig-3g.40gb"
NODE = "prod-h100-bal-01"


def create_pod(sim, namespace: str, name: str, *, labels: dict | None = None) -> None:
    from simcluster.kube import ClusterApi

    spec = {
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {MIG: "1"}}}],
    }
    with sim.state.lock:
        ClusterApi(sim.state.cluster("prod")).create(
            "pods", namespace, {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}
        )


def pod(sim, namespace: str, name: str) -> dict | None:
    record = sim.state.cluster("prod").pods.get((namespace, name))
    return None if record is None else record.obj


def mirror(sim) -> None:
    """One discovery poll: the workload mirror (WorkloadProfile) follows the simulator's pods, their devices read
    from the nodes' kubelets (PodResources, inline here as the node agents' inventories would)."""
    assert discover_cluster(sim.clusters["prod"].pk, inventory="inline").run.status == "succeeded"


@pytest.fixture
def received():
    calls = []

    def receiver(sender, **kwargs):
        calls.append(kwargs)

    allocation_ending.connect(receiver)
    yield calls
    allocation_ending.disconnect(receiver)


@pytest.fixture
def running(sim, make_request, operator):
    """team-a holds the 8 3g.40gb units of one node and runs 2 pods on them, mirrored."""
    pool = services.approve(make_request(count=8), actor=operator)
    assert provision_pool_task(pool.pk) == "active"
    create_pod(sim, "team-a", "w1", labels={"app": "w"})
    create_pod(sim, "team-a", "w2")
    assert pod(sim, "team-a", "w1")["status"]["phase"] == "Running"
    mirror(sim)
    return pool


def busy_units(pool) -> set[int]:
    return set(Allocation.objects.filter(pool=pool).in_use().values_list("pk", flat=True))


@pytest.mark.postgres
def test_a_released_unit_ends_for_real(sim, running, operator, settings, received):
    settings.ALLOCATION_ENDING_GRACE_S = 300
    pool, cluster = running, sim.clusters["prod"]
    busy = busy_units(pool)
    assert len(busy) == 2
    services.release(pool.request, actor=operator, reason="done with it")
    units = list(Allocation.objects.filter(pool=pool).order_by("pk"))
    t0 = units[0].released_at
    # The busy units are ending; the idle ones were empty, so they ended at once (free for the queue).
    assert {u.pk for u in units if u.state == AllocationState.ENDING} == busy
    assert {u.vacated_at for u in units if u.pk not in busy} == {t0}
    # The project is told once, with when its pods go.
    assert len(received) == 1
    notice = received[0]
    assert (notice["project_id"], notice["allocation_ids"], notice["reason"]) == (
        pool.project_id,
        [u.pk for u in units],
        "done with it",
    )
    assert (notice["at"], notice["evict_after"]) == (t0, t0 + dt.timedelta(seconds=300))
    # Handed to nobody while ending: not free, even once its pods are gone from the mirror.
    ids = [u.mig_instance_id for u in units]
    ending_ids = [u.mig_instance_id for u in units if u.pk in busy]
    assert MigInstance.objects.free().filter(pk__in=ids).count() == 6
    assert not MigInstance.objects.free().filter(pk__in=ending_ids).exists()
    states = MigInstance.objects.annotate_availability().filter(pk__in=ending_ids)
    assert sorted(states.values_list("availability", flat=True)) == [Availability.IN_USE] * 2
    # Its pods are not trespassers while they are being evicted.
    assert all(pool.project_id in owners(cluster)[(u.gpu_id, u.mig_instance_id)] for u in units if u.pk in busy)

    # Within the grace period: the pods keep running.
    first = sweep_ending(cluster, now=t0 + dt.timedelta(seconds=30))
    assert first.summary() == {
        "vacated": 0,
        "evicted": 0,
        "blocked": 0,
        "forced": 0,
        "gone": 0,
        "waiting": 2,
        "failed": 0,
    }
    assert pod(sim, "team-a", "w1") is not None and not Eviction.objects.exists()
    # At the end of the grace period: evicted through the Eviction API, audited.
    due = sweep_ending(cluster, now=t0 + dt.timedelta(seconds=300))
    assert (due.evicted, due.vacated) == (2, 0)
    assert pod(sim, "team-a", "w1") is None and pod(sim, "team-a", "w2") is None
    audit = sorted(Eviction.objects.values_list("pod_name", "outcome", "project", "allocation__pool"))
    assert audit == [("w1", "evicted", pool.project_id, pool.pk), ("w2", "evicted", pool.project_id, pool.pk)]
    assert all("done with it" in reason for reason in Eviction.objects.values_list("reason", flat=True))
    # Before the next poll the mirror still has the pods: the units stay ending, and not free.
    assert MigInstance.objects.annotate_availability().get(pk=ending_ids[0]).availability == Availability.IN_USE
    # The next poll mirrors the pods gone; the sweep vacates the units and they are free again.
    mirror(sim)
    assert set(
        MigInstance.objects.annotate_availability().filter(pk__in=ending_ids).values_list("availability", flat=True)
    ) == {Availability.ENDING}
    last = sweep_ending(cluster, now=t0 + dt.timedelta(seconds=330))
    assert (last.vacated, last.evicted) == (2, 0)
    assert {u.state for u in Allocation.objects.filter(pool=pool)} == {AllocationState.ENDED}
    assert MigInstance.objects.free().filter(pk__in=ids).count() == 8
    assert sweep_ending(cluster, now=t0 + dt.timedelta(seconds=400)).summary()["vacated"] == 0  # idempotent


@pytest.mark.postgres
def test_a_disruption_budget_is_respected_until_the_hard_deadline(sim, running, operator, settings):
    from simcluster.kube import ClusterApi

    settings.ALLOCATION_ENDING_GRACE_S = 300
    settings.ALLOCATION_ENDING_FORCE_AFTER_S = 120
    pool, cluster = running, sim.clusters["prod"]
    with sim.state.lock:  # w1 is the only pod of its budget: the Eviction API answers 429
        ClusterApi(sim.state.cluster("prod")).create(
            "poddisruptionbudgets",
            "team-a",
            {"metadata": {"name": "keep-w"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "w"}}}},
        )
    services.release(pool.request, actor=operator, reason="done")
    t0 = Allocation.objects.filter(pool=pool).first().released_at
    blocked = sweep_ending(cluster, now=t0 + dt.timedelta(seconds=300))
    assert (blocked.evicted, blocked.blocked, blocked.forced) == (1, 1, 0)
    assert pod(sim, "team-a", "w1") is not None and pod(sim, "team-a", "w2") is None
    row = Eviction.objects.get(pod_name="w1")
    assert row.outcome == EvictionOutcome.BLOCKED and "disruption budget" in row.detail
    # Still blocked before the deadline; deleted at it.
    assert sweep_ending(cluster, now=t0 + dt.timedelta(seconds=419)).blocked == 1
    forced = sweep_ending(cluster, now=t0 + dt.timedelta(seconds=420))
    assert (forced.forced, forced.blocked) == (1, 0)
    assert pod(sim, "team-a", "w1") is None
    assert list(Eviction.objects.filter(pod_name="w1").order_by("at", "pk").values_list("outcome", flat=True)) == [
        "blocked",
        "blocked",
        "forced",
    ]


@pytest.mark.postgres
def test_a_sweep_leaves_a_unit_another_sweep_holds_until_its_lease_runs_out(sim, running, operator, settings):
    settings.ALLOCATION_ENDING_GRACE_S = 0
    pool, cluster = running, sim.clusters["prod"]
    services.release(pool.request, actor=operator, reason="done")
    t0 = Allocation.objects.filter(pool=pool).first().released_at
    held = t0 + dt.timedelta(seconds=60)  # a worker claimed them, then was killed: its lease is still running
    assert Allocation.objects.filter(pool=pool).ending().update(ending_lease_expires_at=held) == 2
    assert sweep_ending(cluster, now=t0 + dt.timedelta(seconds=10)).evicted == 0
    assert pod(sim, "team-a", "w1") is not None
    assert sweep_ending(cluster, now=held).evicted == 2  # the lease ran out: the next sweep takes over
    assert not Allocation.objects.filter(pool=pool, ending_lease_expires_at__isnull=False).exists()


@pytest.mark.postgres
def test_expiry_a_single_unit_release_and_a_reconfiguration_all_end_through_ending(
    sim, running, operator, settings, received
):
    pool = running
    busy = sorted(busy_units(pool))
    idle = Allocation.objects.filter(pool=pool).exclude(pk__in=busy).order_by("pk")
    # One idle unit released on its own (monitoring's idle release).
    services.release_unit(idle[0], reason="idle for 24 h")
    assert Allocation.objects.get(pk=idle[0].pk).state == AllocationState.ENDED  # no pod on it: empty at once
    assert (received[-1]["allocation_ids"], received[-1]["reason"]) == ([idle[0].pk], "idle for 24 h")
    # A MIG reconfiguration destroys a busy unit's instance, with no equivalent left on its GPU.
    unit = Allocation.objects.get(pk=busy[0])
    MigInstance.objects.filter(gpu=unit.gpu).update(state="gone")
    services.rehome_allocations([unit.mig_instance_id], at=unit.allocated_at + dt.timedelta(hours=1))
    unit.refresh_from_db()
    assert unit.state == AllocationState.ENDING and "destroyed" in unit.end_reason
    assert received[-1]["allocation_ids"][0] == unit.pk
    # Expiry.
    request = pool.request
    request.end_at = request.start_at + dt.timedelta(minutes=1)
    request.expiry_notice_at = request.start_at
    request.save(update_fields=["end_at", "expiry_notice_at"])
    assert services.expire_due(now=request.end_at + dt.timedelta(days=1), notice_s=0)["expired"] == 1
    assert received[-1]["reason"].startswith("expired")
    assert set(Allocation.objects.filter(pool=pool).ending().values_list("pk", flat=True)) == set(busy)
    assert Allocation.objects.filter(pool=pool).active().count() == 0


@pytest.mark.postgres
def test_the_beat_task_sweeps_every_cluster_with_ending_units(sim, running, operator, settings):
    settings.ALLOCATION_ENDING_GRACE_S = 0
    services.release(running.request, actor=operator, reason="done")
    first = sweep_ending_task()
    assert (first["vacated"], first["evicted"], first["waiting"], first["failed"]) == (0, 2, 0, 0)
    again = sweep_ending_task()  # not mirrored yet: the pods are tried again, and found gone (404)
    assert (again["evicted"], again["gone"]) == (0, 2)
    assert running.__class__.objects.get(pk=running.pk).state == PoolState.RELEASED

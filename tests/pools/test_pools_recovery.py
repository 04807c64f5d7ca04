"""Provisioning survives a dead worker or a lost message: leases, claims and the sweep."""

from datetime import timedelta

import pytest
from django.utils import timezone
from pool_world import kube_for

from capacity.adapters.kubernetes import NotFound
from pools import services
from pools.models import GpuPool, PoolRequestTransition
from pools.provisioning import provision_pool
from pools.tasks import provision_pool_task, sweep_provisioning_task

pytestmark = pytest.mark.django_db


def enqueued(callbacks):
    return [(cb.func.__self__.name, cb.args) for cb in callbacks]


def approve_lost(make_request, operator, django_capture_on_commit_callbacks):
    """Approve, dropping the provisioning message (as if the broker lost it)."""
    with django_capture_on_commit_callbacks(execute=False):
        pool = services.approve(make_request(count=2), actor=operator)
    pool.refresh_from_db()
    return pool


def test_approval_gives_the_message_a_lease(sim, make_request, operator, django_capture_on_commit_callbacks):
    before = timezone.now()
    pool = approve_lost(make_request, operator, django_capture_on_commit_callbacks)

    assert pool.claimed_by == ""
    assert pool.lease_expires_at >= before + timedelta(seconds=20)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert services.sweep_provisioning() == []  # the lease still runs: the message may yet arrive
    assert callbacks == []


def test_a_lost_message_is_sent_again_once_its_lease_runs_out(
    sim, make_request, operator, django_capture_on_commit_callbacks
):
    pool = approve_lost(make_request, operator, django_capture_on_commit_callbacks)
    later = pool.lease_expires_at + timedelta(seconds=1)

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert services.sweep_provisioning(now=later) == [pool.pk]
    assert enqueued(callbacks) == [("pools.tasks.provision_pool_task", (pool.pk,))]
    audit = PoolRequestTransition.objects.filter(request=pool.request).last()
    assert (audit.from_state, audit.to_state, audit.reason) == (
        "provisioning",
        "provisioning",
        "provisioning re-queued: not picked up (message lost)",
    )
    # The re-send moved the lease on: a second sweep at the same instant sends nothing.
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert services.sweep_provisioning(now=later) == []
    assert callbacks == []
    assert provision_pool_task(pool.pk) == "active"


def test_a_dead_workers_claim_is_taken_over_after_its_lease(
    sim, make_request, operator, django_capture_on_commit_callbacks
):
    pool = approve_lost(make_request, operator, django_capture_on_commit_callbacks)
    assert services.claim_provisioning(pool, token="dead-worker", task_id="dead-worker")
    pool.refresh_from_db()
    assert (pool.claimed_by, pool.attempts) == ("dead-worker", 1)

    # While the lease runs, another run leaves the pool alone: nothing written to Kubernetes.
    assert provision_pool(pool, task_id="second") == "provisioning"
    pool.refresh_from_db()
    assert (pool.claimed_by, pool.attempts, pool.state) == ("dead-worker", 1, "provisioning")
    with kube_for(sim.clusters["prod"]) as kube, pytest.raises(NotFound):
        kube.get_resource_quota("team-a", f"gpuaas-{pool.pk}")

    later = pool.lease_expires_at + timedelta(seconds=1)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert services.sweep_provisioning(now=later) == [pool.pk]
    assert enqueued(callbacks) == [("pools.tasks.provision_pool_task", (pool.pk,))]
    assert provision_pool_task(pool.pk) == "active"  # the re-sent message: idempotent, re-applies everything
    pool.refresh_from_db()
    assert (pool.state, pool.attempts, pool.claimed_by, pool.lease_expires_at) == ("active", 2, "", None)
    assert PoolRequestTransition.objects.filter(
        request=pool.request, reason="provisioning re-queued: worker lost (claim dead-worker expired)"
    ).exists()
    with kube_for(sim.clusters["prod"]) as kube:
        assert (
            kube.get_resource_quota("team-a", f"gpuaas-{pool.pk}")["spec"]["hard"]["requests.nvidia.com/mig-3g.40gb"]
            == "2"
        )


def test_the_sweep_leaves_active_failed_and_released_pools_alone(
    sim, make_request, operator, alice, django_capture_on_commit_callbacks
):
    active = services.approve(make_request(count=1), actor=operator)
    assert provision_pool_task(active.pk) == "active"
    failed = approve_lost(make_request, operator, django_capture_on_commit_callbacks)
    services.mark_failed(failed, "Kubernetes: boom")
    released = approve_lost(make_request, operator, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=False):
        services.release(released.request, actor=alice)
    GpuPool.objects.update(lease_expires_at=None)

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert sweep_provisioning_task() == 0
    assert callbacks == []


def test_beat_runs_the_provisioning_sweep_and_the_reconcile(settings):
    schedule = settings.CELERY_BEAT_SCHEDULE
    assert schedule["pools-sweep-provisioning"] == {
        "task": "pools.tasks.sweep_provisioning_task",
        "schedule": timedelta(seconds=settings.WORKFLOW_SWEEP_S),
        "options": {"expires": settings.WORKFLOW_SWEEP_S},
    }
    assert schedule["pools-reconcile"]["task"] == "pools.tasks.reconcile_pools_task"
    assert settings.WORKFLOW_LEASE_S + settings.WORKFLOW_SWEEP_S < 60


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_renews_only_its_own_claim(fleet, project, settings):
    """While the body runs the lease moves forward; a claim taken over by another run is not renewed."""
    import time

    from core.leases import Heartbeat
    from pools.models import PoolRequest

    settings.WORKFLOW_LEASE_S = 2
    cluster = fleet.cluster("c1")
    request = PoolRequest.objects.create(project=project, product="H100-80GB", count=1)
    pool = GpuPool.objects.create(
        project=project, request=request, cluster=cluster, name="p", workload_type="inference"
    )
    assert services.claim_provisioning(pool, token="mine")
    first = GpuPool.objects.values_list("lease_expires_at", flat=True).get(pk=pool.pk)

    with Heartbeat(GpuPool.objects.filter(pk=pool.pk, claimed_by="mine")):
        deadline = time.monotonic() + 30
        while GpuPool.objects.values_list("lease_expires_at", flat=True).get(pk=pool.pk) == first:
            assert time.monotonic() < deadline, "no heartbeat"
            time.sleep(0.1)
    assert GpuPool.objects.get(pk=pool.pk).lease_expires_at > first

    GpuPool.objects.filter(pk=pool.pk).update(claimed_by="other", lease_expires_at=first)
    with Heartbeat(GpuPool.objects.filter(pk=pool.pk, claimed_by="mine")):
        time.sleep(1.5)  # two beats' worth
    assert GpuPool.objects.values_list("claimed_by", "lease_expires_at").get(pk=pool.pk) == ("other", first)

"""Provisioning survives a dead worker or a lost message: leases, claims and the sweep."""

from datetime import timedelta

import pytest
from conftest import kube_for
from django.utils import timezone

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

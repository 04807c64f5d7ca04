"""A running step holds a lease: live work is left alone, a dead worker's step is back within a minute."""

from datetime import timedelta

import pytest
from django.utils import timezone
from reconfig_sim import node_row, start_sim

from capacity.choices import ReconfigurationStep as Step
from capacity.models import MigReconfiguration
from operations import reconfiguration as rc
from operations.tasks import reconfiguration_step_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"]}, "")])
    yield sim
    sim.server.stop()


@pytest.fixture
def sent(monkeypatch):
    sent = []
    monkeypatch.setattr(reconfiguration_step_task, "apply_async", lambda args, **options: sent.append(args))
    return sent


def test_recovery_is_bounded_by_lease_plus_sweep_period_under_a_minute(settings):
    assert settings.WORKFLOW_LEASE_S + settings.MIG_RECONFIG_SWEEP_S < 60
    beat = settings.CELERY_BEAT_SCHEDULE["capacity-sweep-reconfigurations"]
    assert beat["schedule"] == timedelta(seconds=settings.MIG_RECONFIG_SWEEP_S)


def test_a_claim_gets_a_lease_and_gives_it_up_with_the_claim(sim, sent, django_capture_on_commit_callbacks):
    reconf = rc.create(node_row("gpu-a"), {"1": ["7g.80gb"]}, force=True)
    seen = {}
    original = rc.STEPS[Step.PLAN]

    def spy(reconf_row, now):
        seen.update(MigReconfiguration.objects.filter(pk=reconf_row.pk).values("state", "lease_expires_at").get())
        return original(reconf_row, now)

    rc.STEPS[Step.PLAN] = spy
    try:
        before = timezone.now()
        assert reconfiguration_step_task(reconf.pk, "plan") == "advanced"
    finally:
        rc.STEPS[Step.PLAN] = original
    assert seen["state"] == "running"
    assert seen["lease_expires_at"] >= before + timedelta(seconds=20)
    reconf.refresh_from_db()
    assert (reconf.state, reconf.claim_token, reconf.lease_expires_at) == ("pending", "", None)


def test_a_live_claim_is_left_alone_however_old_and_taken_back_once_its_lease_lapses(
    sim, sent, django_capture_on_commit_callbacks
):
    reconf = rc.create(node_row("gpu-a"), {"1": ["7g.80gb"]}, force=True)
    now = timezone.now()
    # Claimed two hours ago by a worker still heart-beating: its lease runs for another 15 s.
    MigReconfiguration.objects.filter(pk=reconf.pk).update(
        state="running",
        claim_token="live-task",
        claimed_at=now - timedelta(hours=2),
        lease_expires_at=now + timedelta(seconds=15),
        updated_at=now,
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert rc.sweep(now=now) == {"stale_claims": 0, "requeued": 0}
    reconf.refresh_from_db()
    assert (reconf.state, reconf.claim_token) == ("running", "live-task")
    assert sent == []

    # The worker is SIGKILLed: no more heartbeats, and 16 s later (not 31 minutes) the step is back.
    with_lapse = now + timedelta(seconds=16)
    with django_capture_on_commit_callbacks(execute=True):
        assert rc.sweep(now=with_lapse) == {"stale_claims": 1, "requeued": 0}
    reconf.refresh_from_db()
    assert (reconf.state, reconf.claim_token, reconf.lease_expires_at) == ("pending", "", None)
    assert sent == [(reconf.pk, "plan")]
    assert reconf.steps.filter(message="worker lost (claim live-task expired); step re-queued").count() == 1


def test_a_lost_pending_message_is_sent_again_once_per_idle_period(sim, sent, django_capture_on_commit_callbacks):
    reconf = rc.create(node_row("gpu-a"), {"1": ["7g.80gb"]}, force=True)
    reconf.refresh_from_db()
    idle = timedelta(seconds=rc.idle_s())
    assert rc.sweep(now=reconf.updated_at + idle - timedelta(seconds=1)) == {"stale_claims": 0, "requeued": 0}

    later = reconf.updated_at + idle + timedelta(seconds=1)
    with django_capture_on_commit_callbacks(execute=True):
        assert rc.sweep(now=later) == {"stale_claims": 0, "requeued": 1}
    assert sent == [(reconf.pk, "plan")]
    # The re-send stamped the row: a concurrent or immediate second sweep sends nothing more.
    with django_capture_on_commit_callbacks(execute=True):
        assert rc.sweep(now=later) == {"stale_claims": 0, "requeued": 0}
    assert sent == [(reconf.pk, "plan")]

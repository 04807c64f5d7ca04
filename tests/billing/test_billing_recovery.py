"""Metering and month closes whose worker died are re-sent by the sweep; live runs are left alone."""

from datetime import timedelta

import pytest
from billing_helpers import month
from django.utils import timezone

from billing import recovery, services, tasks
from billing.choices import RunStatus
from billing.models import BillingRun, MeteringWatermark, Statement, UsageRecord
from billing.periods import HOUR, floor_hour

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch):
    sent = []
    monkeypatch.setattr(tasks.meter_usage_task, "apply_async", lambda **kw: sent.append(("meter", kw)))
    monkeypatch.setattr(tasks.close_month_task, "apply_async", lambda **kw: sent.append(("close", kw)))
    return sent


def test_metering_behind_with_a_dead_runs_lease_is_re_sent_once(project, allocate, sent):
    now = floor_hour(timezone.now())
    allocate(project, now - 3 * HOUR, now - HOUR)
    services.watermark()
    MeteringWatermark.objects.filter(pk=1).update(
        claimed_by="dead", lease_expires_at=timezone.now() - timedelta(seconds=1)
    )

    assert recovery.sweep() == {"metering": 1, "closes": 0}
    assert sent == [("meter", {"expires": 20})]
    mark = MeteringWatermark.objects.get(pk=1)
    assert (mark.claimed_by, mark.lease_expires_at > timezone.now()) == ("", True)
    assert recovery.sweep() == {"metering": 0, "closes": 0}  # the new message has its lease
    assert len(sent) == 1

    assert tasks.meter_usage_task.run() == 3
    assert UsageRecord.objects.count() == 2
    assert MeteringWatermark.objects.values_list("claimed_by", "lease_expires_at").get() == ("", None)


def test_a_live_metering_run_is_left_alone_and_not_doubled(project, allocate, sent):
    now = floor_hour(timezone.now())
    allocate(project, now - 3 * HOUR, now - HOUR)
    services.watermark()
    assert recovery.claim_metering("live")

    assert recovery.sweep() == {"metering": 0, "closes": 0}
    assert tasks.meter_usage_task.run() == 0  # the live run has the lease
    assert UsageRecord.objects.count() == 0
    assert sent == []


def test_nothing_to_meter_nothing_sent(project, allocate, sent):
    allocate(project, floor_hour(timezone.now()))
    services.watermark()
    assert recovery.sweep() == {"metering": 0, "closes": 0}
    assert sent == []


def test_a_close_whose_worker_died_is_re_sent_and_finished_once(project, allocate, sent):
    allocate(project, "2026-03-10 10:00", "2026-03-10 11:00")
    run = services.start_close_run(month("2026-03"))
    now = timezone.now()
    BillingRun.objects.filter(pk=run.pk).update(claimed_by="live", lease_expires_at=now + timedelta(seconds=10))

    # While its worker heart-beats, nobody else closes the month.
    assert recovery.sweep(now=now)["closes"] == 0
    assert tasks.close_month_task.run(run_id=run.pk) == 0
    assert Statement.objects.count() == 0

    # The worker died: 11 s later its lease has lapsed and the close is sent again, once.
    later = now + timedelta(seconds=11)
    assert recovery.sweep(now=later)["closes"] == 1
    assert recovery.sweep(now=later)["closes"] == 0
    assert [s for s in sent if s[0] == "close"] == [("close", {"kwargs": {"run_id": run.pk}, "expires": 24 * 3600})]
    assert tasks.close_month_task.run(run_id=run.pk) == 1
    assert tasks.close_month_task.run(run_id=run.pk) == 0
    run.refresh_from_db()
    assert (run.status, run.statements) == (RunStatus.SUCCEEDED, 1)
    assert Statement.objects.count() == 1
    assert recovery.sweep(now=later + timedelta(hours=1))["closes"] == 0  # succeeded: nothing to recover


def test_an_unclaimed_close_is_re_sent_only_after_one_lease(project, sent):
    run = services.start_close_run(month("2026-03"))  # its message is never delivered (not committed here)
    run.refresh_from_db()
    assert recovery.sweep(now=run.started_at + timedelta(seconds=19)) == {"metering": 0, "closes": 0}
    assert recovery.sweep(now=run.started_at + timedelta(seconds=21)) == {"metering": 0, "closes": 1}
    assert sent == [("close", {"kwargs": {"run_id": run.pk}, "expires": 24 * 3600})]


def test_beat_runs_the_billing_sweep_every_sweep_period(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["billing-sweep"]
    assert (entry["task"], entry["schedule"]) == ("billing.tasks.sweep_billing_task", timedelta(seconds=30))

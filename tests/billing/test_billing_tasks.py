"""Billing tasks: thin, idempotent, recorded in BillingRun; the beat schedule routes them to the billing queue."""

from decimal import Decimal

import pytest
from billing_helpers import month
from django.conf import settings
from django.utils import timezone

from billing import services, tasks
from billing.choices import RunKind, RunStatus
from billing.models import BillingRun, Statement, UsageRecord
from billing.periods import HOUR, floor_hour

pytestmark = pytest.mark.django_db


def test_meter_task_records_a_run_only_when_it_metered(project, allocate):
    now = floor_hour(timezone.now())
    allocate(project, now - 3 * HOUR, now - HOUR)

    assert tasks.meter_usage_task.run() == 3
    assert tasks.meter_usage_task.run() == 0

    run = BillingRun.objects.get()
    assert (run.kind, run.status, run.hours_metered, run.records_written, run.metered_until) == (
        RunKind.METER,
        RunStatus.SUCCEEDED,
        3,
        2,
        now,
    )
    assert UsageRecord.objects.count() == 2


def test_close_task_for_a_run_makes_statements_and_finishes_the_run(project, allocate):
    allocate(project, "2026-03-10 10:00", "2026-03-10 11:00")
    run = services.start_close_run(month("2026-03"))

    assert tasks.close_month_task.run(run_id=run.pk) == 1
    assert tasks.close_month_task.run(run_id=run.pk) == 0  # done already: returns early

    run.refresh_from_db()
    assert (run.status, run.statements, run.finished_at is not None) == (RunStatus.SUCCEEDED, 1, True)
    assert Statement.objects.get().total_amount == Decimal("2.50")


def test_close_task_from_beat_closes_the_previous_month(project):
    assert tasks.close_month_task.run() == 0
    run = BillingRun.objects.get()
    assert (run.kind, run.period, run.status) == (RunKind.CLOSE, services.previous_period(), RunStatus.SUCCEEDED)


def test_close_run_is_enqueued_after_commit(django_capture_on_commit_callbacks, monkeypatch):
    sent = []
    monkeypatch.setattr(tasks.close_month_task, "apply_async", lambda **kw: sent.append(kw))
    with django_capture_on_commit_callbacks(execute=True):
        run = services.start_close_run(month("2026-03"))
        assert sent == []
    assert sent == [{"kwargs": {"run_id": run.pk}, "task_id": run.task_id, "expires": 24 * 3600}]


def test_beat_schedule_and_routes():
    schedule = settings.CELERY_BEAT_SCHEDULE
    assert schedule["billing-meter-usage"]["task"] == "billing.tasks.meter_usage_task"
    assert schedule["billing-meter-usage"]["options"] == {"expires": settings.BILLING_METER_INTERVAL_S}
    assert schedule["billing-close-month"]["task"] == "billing.tasks.close_month_task"
    assert settings.CELERY_TASK_ROUTES["billing.tasks.*"] == {"queue": "billing"}

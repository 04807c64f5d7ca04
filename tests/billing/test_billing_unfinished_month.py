"""A month that has not ended can be neither finalised nor closed: the rest of its usage would never be billed."""

from decimal import Decimal

import pytest
from billing_helpers import at, month
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from billing import services, tasks
from billing.choices import RunStatus, StatementState
from billing.models import BillingRun, MonthNotEnded, Statement, UsageRecord
from billing.periods import HOUR, floor_hour, month_start

pytestmark = pytest.mark.django_db


@pytest.fixture
def this_month(project, allocate):
    """The current month's draft, with some usage already metered."""
    now = floor_hour(timezone.now())
    allocate(project, now - 2 * HOUR)
    services.meter_usage(now=now)
    return services.generate_statement(project, month_start(now))


def _unchanged(statement):
    statement = Statement.objects.get(pk=statement.pk)
    lines = list(statement.lines.order_by("pk").values_list("pk", "amount"))
    return statement.state, statement.finalised_at, statement.total_amount, lines


def test_service_refuses_to_finalise_an_unfinished_month(this_month, operator):
    before = _unchanged(this_month)
    with pytest.raises(MonthNotEnded, match=r"has not ended: usage is still being metered into it"):
        services.finalise_statement(this_month, actor=operator)
    assert _unchanged(this_month) == before
    assert before[0] == StatementState.DRAFT
    assert UsageRecord.objects.filter(billed_on__isnull=False).count() == 0


def test_finalise_on_the_last_hour_of_a_month_is_refused_and_at_its_end_allowed(project, allocate):
    allocate(project, "2026-03-31 10:00", "2026-03-31 12:00")
    services.meter_usage(now=at("2026-03-31 13:00"))
    draft = services.generate_statement(project, month("2026-03"))

    with pytest.raises(MonthNotEnded, match=r"Finalise or close it from 2026-04-01 00:00 UTC"):
        services.finalise_statement(draft, now=at("2026-03-31 23:59"))
    assert Statement.objects.get(pk=draft.pk).state == StatementState.DRAFT

    assert services.finalise_statement(draft, now=at("2026-04-01 00:00")).state == StatementState.FINALISED


def test_api_answers_400_with_a_message(this_month, operator):
    client = APIClient()
    client.force_authenticate(operator)
    before = _unchanged(this_month)

    response = client.post(f"/api/v1/billing/statements/{this_month.pk}/finalise/")

    assert response.status_code == 400
    assert list(response.json()) == ["period"]
    assert "has not ended" in response.json()["period"][0]
    assert _unchanged(this_month) == before


def test_admin_action_shows_an_error_and_finalises_the_rest(this_month, project, allocate, client, operator):
    allocate(project, "2026-03-10 10:00", "2026-03-10 11:00")
    services.meter_usage(now=timezone.now())
    march = services.generate_statement(project, month("2026-03"))
    before = _unchanged(this_month)
    client.force_login(operator)

    response = client.post(
        reverse("admin:billing_statement_changelist"),
        {"action": "finalise", "_selected_action": [this_month.pk, march.pk]},
        follow=True,
    )

    html = response.content.decode()
    assert "1 statement(s) finalised." in html
    assert f"Not finalised: team-a {this_month.period:%Y-%m}: {this_month.period:%Y-%m} has not ended" in html
    assert 'class="error"' in html
    assert _unchanged(this_month) == before
    assert Statement.objects.get(pk=march.pk).state == StatementState.FINALISED


def test_api_refuses_to_close_an_unfinished_month(operator, django_capture_on_commit_callbacks):
    client = APIClient()
    client.force_authenticate(operator)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post("/api/v1/billing/runs/", {"period": f"{timezone.now():%Y-%m}"})

    assert response.status_code == 400
    assert "has not ended" in response.json()["period"][0]
    assert (BillingRun.objects.count(), callbacks) == (0, [])


def test_admin_refuses_to_close_an_unfinished_month(client, operator, django_capture_on_commit_callbacks):
    client.force_login(operator)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(reverse("admin:billing_billingrun_add"), {"month": f"{timezone.now():%Y-%m}"})

    assert response.status_code == 200
    assert "has not ended" in response.content.decode()
    assert (BillingRun.objects.count(), callbacks) == (0, [])


def test_close_task_only_closes_ended_months(this_month):
    before = _unchanged(this_month)

    assert tasks.close_month_task.run(period=f"{timezone.now():%Y-%m}") == 0

    run = BillingRun.objects.get()
    assert run.status == RunStatus.FAILED
    assert "has not ended" in run.error
    assert _unchanged(this_month) == before
    with pytest.raises(MonthNotEnded):
        services.close_month(month_start(timezone.now()))


def test_close_command_says_what_to_fix():
    with pytest.raises(CommandError, match="has not ended"):
        call_command("billing", "close", f"{timezone.now():%Y-%m}")
    assert BillingRun.objects.count() == 0


def test_close_of_an_ended_month_still_works(project, allocate):
    allocate(project, "2026-03-10 10:00", "2026-03-10 11:00")
    statements = services.close_month(month("2026-03"))
    assert [(s.state, s.total_amount) for s in statements] == [(StatementState.DRAFT, Decimal("2.50"))]

"""Billing admin: statement lines and daily cost chart; finalise and export actions; cards in force read-only."""

from decimal import Decimal

import pytest
from billing_helpers import at, month
from django.urls import reverse

from billing import services
from billing.choices import StatementState
from billing.models import Statement
from pricing.models import RateCard

pytestmark = pytest.mark.django_db


@pytest.fixture
def statement(project, allocate):
    allocate(project, "2026-03-10 10:00", "2026-03-11 02:00")
    services.meter_usage(now=at("2026-03-11 03:00"))
    return services.generate_statement(project, month("2026-03"))


def test_statement_page_shows_lines_and_daily_chart(client, operator, statement):
    client.force_login(operator)
    html = client.get(reverse("admin:billing_statement_change", args=[statement.pk])).content.decode()
    assert "<svg" in html and "2026-03-10: reserved 35.00" in html and "2026-03-11: reserved 5.00" in html
    assert "H100-80GB full GPU @ 2.5/h" in html
    assert "http://" not in html.split("<svg", 1)[1].split("</svg>", 1)[0].replace("http://www.w3.org/2000/svg", "")


def test_finalise_action_and_csv_export(client, operator, statement):
    client.force_login(operator)
    url = reverse("admin:billing_statement_changelist")
    response = client.post(url, {"action": "finalise", "_selected_action": [statement.pk]}, follow=True)
    assert "1 statement(s) finalised." in response.content.decode()
    assert Statement.objects.get().state == StatementState.FINALISED

    exported = client.post(url, {"action": "export_csv", "_selected_action": [statement.pk]})
    assert exported["Content-Type"] == "text/csv; charset=utf-8"
    assert (
        exported.getvalue()
        .decode()
        .splitlines()[1]
        .startswith(f'"team-a","2026-03",{statement.pk},"finalised","EUR","usage",')
    )


def test_adjustment_through_the_admin_goes_through_the_service(client, operator, statement):
    client.force_login(operator)
    url = reverse("admin:billing_statement_change", args=[statement.pk])
    form = {
        "lines-TOTAL_FORMS": "1",
        "lines-INITIAL_FORMS": "1",
        "lines-MIN_NUM_FORMS": "0",
        "lines-MAX_NUM_FORMS": "1000",
        "lines-0-id": str(statement.lines.get().pk),
        "lines-0-statement": str(statement.pk),
        "lines-2-TOTAL_FORMS": "1",
        "lines-2-INITIAL_FORMS": "0",
        "lines-2-MIN_NUM_FORMS": "0",
        "lines-2-MAX_NUM_FORMS": "1000",
        "lines-2-0-amount": "-5.00",
        "lines-2-0-reason": "Maintenance overran",
        "lines-2-0-statement": str(statement.pk),
    }
    response = client.post(url, form, follow=True)
    assert response.status_code == 200
    statement.refresh_from_db()
    assert (statement.adjustment_amount, statement.total_amount) == (Decimal("-5.00"), Decimal("35.00"))
    assert statement.lines.get(line_type="adjustment").created_by == operator


def test_card_in_force_is_read_only(client, operator):
    client.force_login(operator)
    card = RateCard.objects.get(effective_from=services.EPOCH)
    html = client.get(reverse("admin:pricing_ratecard_change", args=[card.pk])).content.decode()
    assert 'name="_save"' not in html

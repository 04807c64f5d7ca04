"""CSV export: one row per statement line, columns fixed, money as plain decimals, empty = not measured."""

from decimal import Decimal

import pytest
from billing_helpers import at, month, transition
from rest_framework.test import APIClient

from billing import services
from billing.models import Statement

pytestmark = pytest.mark.django_db

HEADER = (
    '"project","period","statement","state","currency","line_type","pool","kind","product","profile_name",'
    '"replicas","description","hourly_rate","hours","amount","used_amount","idle_amount","unmeasured_amount",'
    '"sm_activity","energy_kwh","reason","usage_period"'
)
# Every text cell quoted, numbers bare, empty cells as "" (billing.exports.csvsafe).
STATEMENT = '"team-a","2026-03",{s},"draft","EUR"'


def test_statement_csv_line_by_line(project, allocate, bob, operator):
    full = allocate(project, "2026-03-10 10:30", "2026-03-10 12:15")
    mig = allocate(project, "2026-03-10 10:00", "2026-03-10 11:00", kind="mig", profile="3g.40gb")
    failed = allocate(project, "2026-03-10 10:00", "2026-03-10 11:00", request_state="released")
    transition(failed.pool.request, "provisioning", "failed", "2026-03-10 10:05")
    transition(failed.pool.request, "failed", "provisioning", "2026-03-10 10:35")
    transition(failed.pool.request, "provisioning", "active", "2026-03-10 10:40")
    services.meter_usage(now=at("2026-03-10 13:00"))
    statement = services.generate_statement(project, month("2026-03"))
    services.add_adjustment(statement, amount=Decimal("-0.50"), reason="Goodwill, ticket 42", actor=operator)

    client = APIClient()
    client.force_authenticate(bob)
    response = client.get(f"/api/v1/billing/statements/{statement.pk}/download/?fmt=csv")

    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="statement-team-a-2026-03.csv"'
    s = Statement.objects.get().pk
    content = response.getvalue().decode()
    assert content.endswith("\r\n") and "\n" not in content.replace("\r\n", "")  # RFC 4180 line endings
    rows = content.split("\r\n")[:-1]
    head = STATEMENT.format(s=s)
    assert rows == [
        HEADER,
        f'{head},"usage","{full.pool.name}","full","H100-80GB","","",'
        f'"{full.pool.name}: H100-80GB full GPU @ 2.5/h",2.500000,1.7500,4.38,"","",4.38,"","","",""',
        f'{head},"usage","{mig.pool.name}","mig","H100-80GB","3g.40gb","",'
        f'"{mig.pool.name}: H100-80GB 3g.40gb @ 1.25/h",1.250000,1.0000,1.25,"","",1.25,"","","",""',
        f'{head},"usage","{failed.pool.name}","full","H100-80GB","","",'
        f'"{failed.pool.name}: H100-80GB full GPU @ 2.5/h",2.500000,1.0000,2.50,"","",2.50,"","","",""',
        f'{head},"failed_credit","{failed.pool.name}","full","H100-80GB","","",'
        f'"Credit (provisioning failed) {failed.pool.name}: H100-80GB full GPU @ 2.5/h",2.500000,0.5000,-1.25,'
        '"","","","","","provisioning failed",""',
        f'{head},"adjustment","","","","","","Adjustment: Goodwill, ticket 42","",0.0000,-0.50,"","","","","",'
        '"Goodwill, ticket 42",""',
    ]

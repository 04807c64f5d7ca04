"""CSV exports never hand a spreadsheet a formula: member-chosen text is neutralised, numbers stay numbers."""

import csv
import io
from decimal import Decimal

import pytest
from billing_helpers import at, month
from django.urls import reverse
from rest_framework.test import APIClient

from billing import services
from billing.csvsafe import SafeDictWriter, SafeWriter, neutralise, safe_cell
from pools.models import GpuPool

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("=1+1", "'=1+1"),
        ("+SUM(A1)", "'+SUM(A1)"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tcmd", "'\tcmd"),
        ("\rcmd", "'\rcmd"),
        ("training", "training"),
        ("a=b", "a=b"),
        ("", ""),
    ],
)
def test_neutralise(text, expected):
    assert neutralise(text) == expected


def test_safe_cell_keeps_numbers_and_neutralises_text():
    assert safe_cell(Decimal("-12.50")) == "-12.50"
    assert safe_cell(-3) == "-3"
    assert safe_cell(None) == ""
    assert safe_cell("-12.50", numeric=True) == "-12.50"
    assert safe_cell("-12.50") == "'-12.50"  # text that looks like a number is still text
    assert safe_cell("-1+2", numeric=True) == "'-1+2"
    assert safe_cell("-2e3", numeric=True) == "'-2e3"
    assert safe_cell("=HYPERLINK(1)", numeric=True) == "'=HYPERLINK(1)"


def test_safe_writers():
    out = io.StringIO()
    writer = SafeWriter(out, numeric=[1], lineterminator="\n")
    writer.writerows([["=cmd", "-1.50"], ["ok", "=2"]])
    out2 = io.StringIO()
    dict_writer = SafeDictWriter(out2, fieldnames=["name", "amount"], numeric={"amount"}, lineterminator="\n")
    dict_writer.writeheader()
    dict_writer.writerow({"name": "@x", "amount": "-0.10"})
    assert out.getvalue() == "'=cmd,-1.50\nok,'=2\n"
    assert out2.getvalue() == "name,amount\n'@x,-0.10\n"


@pytest.fixture
def hostile_statement(project, allocate, operator):
    allocation = allocate(project, "2026-03-10 10:00", "2026-03-10 11:00")
    GpuPool.objects.filter(pk=allocation.pool_id).update(name='=HYPERLINK("http://evil","x")')
    services.meter_usage(now=at("2026-03-10 12:00"))
    statement = services.generate_statement(project, month("2026-03"))
    services.add_adjustment(statement, amount=Decimal("-12.50"), reason="+cmd|' /C calc'!A0", actor=operator)
    services.add_adjustment(statement, amount=Decimal("1.00"), reason="@SUM(1)", actor=operator)
    return statement


def _cells(content: bytes) -> list[dict]:
    return list(csv.DictReader(io.StringIO(content.decode())))


def test_api_csv_neutralises_member_text_and_keeps_negative_amounts(hostile_statement, bob):
    client = APIClient()
    client.force_authenticate(bob)
    response = client.get(f"/api/v1/billing/statements/{hostile_statement.pk}/download/?fmt=csv")

    rows = _cells(response.content)
    assert response.status_code == 200
    assert [(r["line_type"], r["pool"], r["description"], r["amount"], r["reason"]) for r in rows] == [
        (
            "usage",
            '\'=HYPERLINK("http://evil","x")',
            '\'=HYPERLINK("http://evil","x"): H100-80GB full GPU @ 2.5/h',
            "2.50",
            "",
        ),
        ("adjustment", "", "Adjustment: +cmd|' /C calc'!A0", "-12.50", "'+cmd|' /C calc'!A0"),
        ("adjustment", "", "Adjustment: @SUM(1)", "1.00", "'@SUM(1)"),
    ]


def test_admin_csv_export_is_neutralised_too(hostile_statement, client, operator):
    client.force_login(operator)
    url = reverse("admin:billing_statement_changelist")
    exported = client.post(url, {"action": "export_csv", "_selected_action": [hostile_statement.pk]})

    rows = _cells(exported.content)
    assert [(r["pool"][:2], r["amount"], r["reason"][:2]) for r in rows] == [
        ("'=", "2.50", ""),
        ("", "-12.50", "'+"),
        ("", "1.00", "'@"),
    ]

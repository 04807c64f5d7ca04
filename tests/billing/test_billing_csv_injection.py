"""CSV exports never hand a spreadsheet a formula: member-chosen text is neutralised, numbers stay numbers."""

import csv
import io
from decimal import Decimal

import pytest
from billing_helpers import at, month
from django.urls import reverse
from rest_framework.test import APIClient

from billing import services
from billing.exports.csvsafe import SafeDictWriter, SafeWriter, neutralise, safe_cell
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
        ("\rcmd", "' cmd"),
        ("x\r=1+1", "x =1+1"),  # a line break inside a name never starts a line a reader takes for a row
        ("x\n=1+1", "x =1+1"),
        ("a\u2028b\u2029c\x85d\x0be\x0cf\x1cg", "a b c d e f g"),
        ("\n=1+1", "' =1+1"),  # a break first, then a formula: still neutralised
        ("  =1+1", "'  =1+1"),  # leading spaces do not hide a formula
        ("\u2028@SUM(1)", "' @SUM(1)"),
        ("training", "training"),
        ("a=b", "a=b"),
        ("", ""),
    ],
)
def test_neutralise(text, expected):
    assert neutralise(text) == expected


def test_safe_cell_keeps_numbers_and_neutralises_text():
    assert safe_cell(Decimal("-12.50")) == Decimal("-12.50")
    assert str(safe_cell(Decimal("1E+2"))) == "100"
    assert safe_cell(-3) == -3
    assert safe_cell(None) == ""
    assert safe_cell(True) == "True"
    assert safe_cell("-12.50", numeric=True) == Decimal("-12.50")
    assert safe_cell("-12.50") == "'-12.50"  # text that looks like a number is still text
    assert safe_cell("-1+2", numeric=True) == "'-1+2"
    assert safe_cell("-2e3", numeric=True) == "'-2e3"
    assert safe_cell("=HYPERLINK(1)", numeric=True) == "'=HYPERLINK(1)"


def test_safe_writers_quote_every_text_cell_and_end_rows_with_crlf():
    out = io.StringIO()
    writer = SafeWriter(out, numeric=[1], lineterminator="\n", quoting=csv.QUOTE_MINIMAL)  # cannot be loosened
    writer.writerows([["=cmd", "-1.50"], ["ok", "=2"], ["x\r=1+1", None]])
    out2 = io.StringIO()
    dict_writer = SafeDictWriter(out2, fieldnames=["name", "amount"], numeric={"amount"})
    dict_writer.writeheader()
    dict_writer.writerow({"name": "@x", "amount": "-0.10"})
    assert out.getvalue() == '"\'=cmd",-1.50\r\n"ok","\'=2"\r\n"x =1+1",""\r\n'
    assert out2.getvalue() == '"name","amount"\r\n"\'@x",-0.10\r\n'


def test_no_line_breaking_character_survives_in_a_written_file():
    """Whatever the text, each row is exactly one physical line, for a reader that splits on any break."""
    breaks = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
    out = io.StringIO()
    SafeWriter(out).writerows([[f"a{b}=1+1", f"{b}b"] for b in breaks])
    lines = out.getvalue().split("\r\n")
    assert lines[-1] == ""
    assert [line.splitlines() for line in lines[:-1]] == [[line] for line in lines[:-1]]
    assert len(lines) - 1 == len(breaks)


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
    return list(csv.DictReader(io.StringIO(content.decode(), newline="")))


def test_api_csv_neutralises_member_text_and_keeps_negative_amounts(hostile_statement, bob):
    client = APIClient()
    client.force_authenticate(bob)
    response = client.get(f"/api/v1/billing/statements/{hostile_statement.pk}/download/?fmt=csv")

    rows = _cells(response.getvalue())
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

    rows = _cells(exported.getvalue())
    assert [(r["pool"][:2], r["amount"], r["reason"][:2]) for r in rows] == [
        ("'=", "2.50", ""),
        ("", "-12.50", "'+"),
        ("", "1.00", "'@"),
    ]


def test_a_line_break_inside_a_name_stays_in_its_cell(project, allocate, bob):
    """`x\r=1+1` as a pool name: one row per line, the name on one line, no cell starting with =."""
    allocation = allocate(project, "2026-03-10 10:00", "2026-03-10 11:00")
    GpuPool.objects.filter(pk=allocation.pool_id).update(name="x\r=1+1")
    services.meter_usage(now=at("2026-03-10 12:00"))
    statement = services.generate_statement(project, month("2026-03"))
    client = APIClient()
    client.force_authenticate(bob)
    content = client.get(f"/api/v1/billing/statements/{statement.pk}/download/?fmt=csv").getvalue().decode()

    physical = content.split("\r\n")
    assert len(physical) == 3 and physical[-1] == ""  # header, one line, nothing else
    assert "\r" not in content.replace("\r\n", "") and "\n" not in content.replace("\r\n", "")
    assert '"x =1+1"' in physical[1]
    assert all(
        cell.startswith('"') or cell == "" or cell[0].isdigit() or cell[0] == "-" for cell in physical[1].split(",")
    )
    assert [r["pool"] for r in _cells(content.encode())] == ["x =1+1"]

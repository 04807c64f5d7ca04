"""The statements' CSV is streamed: written and sent in pieces from one chunked query, never built whole."""

import csv
import io
from decimal import Decimal

import pytest
from billing_helpers import at, month
from django.db import connection
from django.http import StreamingHttpResponse
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from rest_framework.test import APIClient

from billing import exports, services
from billing.models import Statement
from pools.models import GpuPool

pytestmark = pytest.mark.django_db


@pytest.fixture
def statements(project, other_project, allocate, operator):
    """team-a's March with a pool named like a formula and a hostile adjustment; team-b's March."""
    allocation = allocate(project, "2026-03-10 10:00", "2026-03-10 11:00")
    GpuPool.objects.filter(pk=allocation.pool_id).update(name='=HYPERLINK("http://evil","x")')
    allocate(other_project, "2026-03-10 10:00", "2026-03-10 12:00")
    services.meter_usage(now=at("2026-03-10 13:00"))
    ours = services.generate_statement(project, month("2026-03"))
    services.add_adjustment(ours, amount=Decimal("-12.50"), reason="+cmd|' /C calc'!A0", actor=operator)
    theirs = services.generate_statement(other_project, month("2026-03"))
    return ours, theirs


def _rows(text: str) -> list[tuple]:
    return [
        (r["project"], r["line_type"], r["pool"][:2], r["amount"], r["reason"][:2])
        for r in csv.DictReader(io.StringIO(text, newline=""))
    ]


EXPECTED = [
    ("team-a", "usage", "'=", "2.50", ""),
    ("team-a", "adjustment", "", "-12.50", "'+"),
    ("team-b", "usage", "po", "5.00", ""),
]


def test_admin_export_streams_its_rows_in_pieces(client, operator, statements, monkeypatch):
    monkeypatch.setattr(exports, "CSV_CHUNK_ROWS", 2)
    client.force_login(operator)
    response = client.post(
        reverse("admin:billing_statement_changelist"),
        {"action": "export_csv", "_selected_action": [s.pk for s in statements]},
    )

    assert isinstance(response, StreamingHttpResponse) and response.streaming
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="statements.csv"'
    pieces = [piece.decode() for piece in response.streaming_content]
    assert [piece.count("\r\n") for piece in pieces] == [1, 2, 1]  # the header, then 2 rows a piece
    assert _rows("".join(pieces)) == EXPECTED  # in order, formulas neutralised, numbers kept


def test_api_export_streams_too(operator, statements):
    client = APIClient()
    client.force_authenticate(operator)
    response = client.get("/api/v1/billing/statements/export/?fmt=csv&period=2026-03")

    assert response.status_code == 200 and response.streaming
    assert _rows(response.getvalue().decode()) == EXPECTED
    one = client.get(f"/api/v1/billing/statements/{statements[0].pk}/download/")
    assert one.streaming and one["Content-Disposition"] == 'attachment; filename="statement-team-a-2026-03.csv"'
    assert _rows(one.getvalue().decode()) == EXPECTED[:2]


def test_lines_are_read_in_one_query_whatever_the_number_of_statements(statements):
    def queries(queryset) -> int:
        with CaptureQueriesContext(connection) as captured:
            text = "".join(exports.iter_csv(exports.statements_for_export(queryset)))
        assert text.startswith('"project","period"')
        return len(captured)

    assert queries(Statement.objects.filter(pk=statements[0].pk)) == 1
    assert queries(Statement.objects.all()) == 1


def test_nothing_is_read_before_the_response_is_sent(client, operator, statements):
    """The view returns before any line is read: the rows are fetched while the body is sent."""
    client.force_login(operator)
    url = reverse("admin:billing_statement_changelist")
    with CaptureQueriesContext(connection) as captured:
        response = client.post(url, {"action": "export_csv", "_selected_action": [statements[0].pk]})
    assert not any(q["sql"].startswith('SELECT "billing_statementline"') for q in captured.captured_queries)
    assert _rows(response.getvalue().decode()) == EXPECTED[:2]

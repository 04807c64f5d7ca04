"""Statement exports, CSV and JSON, shared by the API and the admin: one row per statement line.

The CSV is streamed (StreamingHttpResponse over iter_csv): lines are read from the database
CSV_CHUNK_ROWS at a time with QuerySet.iterator(), written and sent, so a fleet's month of statements
never sits in memory as a file or as model instances.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

from django.db.models import prefetch_related_objects

from ..models import Statement, StatementLine
from .csvsafe import SafeDictWriter

CSV_COLUMNS = [
    "project",
    "period",
    "statement",
    "state",
    "currency",
    "line_type",
    "pool",
    *StatementLine.SPEC_FIELDS,
    *StatementLine.FIGURE_FIELDS,
    "reason",
    "usage_period",
]
# Numbers the system writes: kept as numbers in a CSV; every other cell is text and neutralised.
NUMERIC_COLUMNS = frozenset(
    {
        "statement",
        "replicas",
        *StatementLine.FIGURE_FIELDS,
    }
)


def statements_for_export(queryset):
    """The statements with their project, in a stable order (project, period). Their lines are read by
    iter_csv (streamed) or to_json (prefetched), not here."""
    return queryset.select_related("project").order_by("project__slug", "period", "pk")


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, Decimal):
        return f"{value:f}"
    return str(value)


def line_row(statement: Statement, line: StatementLine) -> dict[str, str]:
    return {
        "project": statement.project.slug,
        "period": f"{statement.period:%Y-%m}",
        "statement": str(statement.pk),
        "state": statement.state,
        "currency": statement.currency,
        "line_type": line.line_type,
        "pool": line.pool.name if line.pool_id else "",
        "kind": line.kind,
        "product": line.product,
        "profile_name": line.profile_name,
        "replicas": str(line.replicas) if line.kind in ("timeslice", "mps") else "",
        "description": line.description,
        "hourly_rate": _text(line.hourly_rate),
        "hours": _text(line.hours),
        "amount": _text(line.amount),
        "used_amount": _text(line.used_amount),
        "idle_amount": _text(line.idle_amount),
        "unmeasured_amount": _text(line.unmeasured_amount),
        "sm_activity": _text(line.sm_activity),
        "energy_kwh": _text(line.energy_kwh),
        "reason": line.reason,
        "usage_period": f"{line.usage_period:%Y-%m}" if line.usage_period else "",
    }


CSV_CHUNK_ROWS = 2000


class _Echo:
    """A file whose write() hands the text back, so the csv writer's rows can be yielded (Django's docs)."""

    def write(self, text: str) -> str:
        return text


def csv_lines(statements) -> Iterator[StatementLine]:
    """Every line of the `statements` queryset with its statement and project, in export order (project,
    period, statement, then the lines' own order), read CSV_CHUNK_ROWS at a time."""
    return (
        StatementLine.objects.filter(statement__in=statements.order_by().values("pk"))
        .select_related("statement__project", "pool")
        .order_by("statement__project__slug", "statement__period", *StatementLine._meta.ordering)
        .iterator(chunk_size=CSV_CHUNK_ROWS)
    )


def iter_csv(statements) -> Iterator[str]:
    """CSV text in pieces: the header, then every line of every statement, CSV_CHUNK_ROWS rows a piece
    (empty cell = not applicable / not measured). `statements` is a queryset.

    Text cells that a spreadsheet would run as a formula (a pool named "=..." or a reason "+...")
    are prefixed with a single quote (billing.exports.csvsafe); numeric columns stay numbers.
    """
    writer = SafeDictWriter(_Echo(), fieldnames=CSV_COLUMNS, numeric=NUMERIC_COLUMNS)
    yield writer.writeheader()
    rows: list[str] = []
    for line in csv_lines(statements):
        rows.append(writer.writerow(line_row(line.statement, line)))
        if len(rows) == CSV_CHUNK_ROWS:
            yield "".join(rows)
            rows = []
    if rows:
        yield "".join(rows)


def _money(value) -> str | None:
    return None if value is None else f"{value:f}"


def to_json(statements) -> list[dict]:
    """JSON-ready statements with totals and lines; money as decimal strings (never floats)."""
    statements = list(statements)
    prefetch_related_objects(statements, "lines__pool")
    result = []
    for s in statements:
        result.append(
            {
                "id": s.pk,
                "project": s.project.slug,
                "period": f"{s.period:%Y-%m}",
                "state": s.state,
                "currency": s.currency,
                "reserved_hours": _money(s.reserved_hours),
                "reserved_amount": _money(s.reserved_amount),
                "credit_amount": _money(s.credit_amount),
                "adjustment_amount": _money(s.adjustment_amount),
                "total_amount": _money(s.total_amount),
                "used_amount": _money(s.used_amount),
                "idle_amount": _money(s.idle_amount),
                "unmeasured_amount": _money(s.unmeasured_amount),
                "energy_kwh": _money(s.energy_kwh),
                "finalised_at": s.finalised_at.isoformat() if s.finalised_at else None,
                "lines": [
                    {key: (value if value != "" else None) for key, value in line_row(s, line).items()}
                    for line in s.lines.all()
                ],
            }
        )
    return result


def filename(statements, extension: str) -> str:
    """`statement-<project>-<month>.<ext>` for one statement, `statements.<ext>` otherwise (a list or a
    queryset: at most two are read)."""
    first = list(statements[:2])
    if len(first) == 1:
        s = first[0]
        return f"statement-{s.project.slug}-{s.period:%Y-%m}.{extension}"
    return f"statements.{extension}"

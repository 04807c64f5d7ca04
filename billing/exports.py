"""Statement exports, CSV and JSON, shared by the API and the admin: one row per statement line."""

from __future__ import annotations

import io
from decimal import Decimal

from .csvsafe import SafeDictWriter
from .models import Statement, StatementLine

CSV_COLUMNS = [
    "project",
    "period",
    "statement",
    "state",
    "currency",
    "line_type",
    "pool",
    "kind",
    "product",
    "profile_name",
    "replicas",
    "description",
    "hourly_rate",
    "hours",
    "amount",
    "used_amount",
    "idle_amount",
    "unmeasured_amount",
    "sm_activity",
    "energy_kwh",
    "reason",
    "usage_period",
]
# Numbers the system writes: kept as numbers in a CSV; every other cell is text and neutralised.
NUMERIC_COLUMNS = frozenset(
    {
        "statement",
        "replicas",
        "hourly_rate",
        "hours",
        "amount",
        "used_amount",
        "idle_amount",
        "unmeasured_amount",
        "sm_activity",
        "energy_kwh",
    }
)


def statements_for_export(queryset):
    """The statements with what an export reads, in a stable order (project, period)."""
    return queryset.select_related("project").prefetch_related("lines__pool").order_by("project__slug", "period", "pk")


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
        "replicas": str(line.replicas) if line.kind == "timeslice" else "",
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


def to_csv(statements) -> str:
    """CSV text: a header, then every line of every statement (empty cell = not applicable / not measured).

    Text cells that a spreadsheet would run as a formula (a pool named "=..." or a reason "+...")
    are prefixed with a single quote (billing.csvsafe); numeric columns stay numbers.
    """
    out = io.StringIO()
    writer = SafeDictWriter(out, fieldnames=CSV_COLUMNS, numeric=NUMERIC_COLUMNS)
    writer.writeheader()
    for statement in statements:
        for line in statement.lines.all():
            writer.writerow(line_row(statement, line))
    return out.getvalue()


def _money(value) -> str | None:
    return None if value is None else f"{value:f}"


def to_json(statements) -> list[dict]:
    """JSON-ready statements with totals and lines; money as decimal strings (never floats)."""
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


def filename(statements: list[Statement], extension: str) -> str:
    if len(statements) == 1:
        s = statements[0]
        return f"statement-{s.project.slug}-{s.period:%Y-%m}.{extension}"
    return f"statements.{extension}"

"""Admin changelists over fleet-sized tables: counted without scanning them (issue 28).

A changelist needs its row count for the paginator. On a table of a million pool requests or usage
records COUNT(*) reads every row (PostgreSQL keeps no row count), so each page of 100 would cost a
full scan. Here, on PostgreSQL only:

- an unfiltered changelist takes the table's row estimate (`pg_class.reltuples`, kept by ANALYZE and
  autovacuum);
- a filtered or searched one takes the planner's estimate of its query (`EXPLAIN`);

and uses it when it is above ESTIMATE_ABOVE rows, where an estimate off by a few per cent does not
matter and an exact count would be slow. Below that, and always on SQLite, the count is exact. The
pagination template then says "about N" (gpuaas/templates/admin/pagination.html reads
`paginator.estimated`).

healthchecks does the same with a fixed count; an estimate keeps the page numbers close to the truth.
A kernel module: it imports no app, so every app's admin may use it.
"""

from __future__ import annotations

import json

from django.core.paginator import Paginator
from django.db import connections
from django.utils.functional import cached_property

# Above this many rows (estimated) a changelist shows the estimate instead of counting.
ESTIMATE_ABOVE = 10_000


def _table_estimate(queryset) -> int | None:
    """pg_class.reltuples of the queryset's table; None when never analysed (-1) or not found."""
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
            [queryset.model._meta.db_table],
        )
        row = cursor.fetchone()
    return row[0] if row and row[0] >= 0 else None


def _plan_estimate(queryset) -> int | None:
    """The rows the planner expects `queryset` (unordered) to return, from EXPLAIN (FORMAT JSON)."""
    plan = json.loads(queryset.order_by().explain(format="json"))
    return int(plan[0]["Plan"]["Plan Rows"])


def estimated_count(queryset) -> int | None:
    """PostgreSQL's estimate of len(queryset) without counting it; None on other databases."""
    if connections[queryset.db].vendor != "postgresql":
        return None
    query = queryset.query
    if not query.where and not query.distinct and not query.combinator:
        estimate = _table_estimate(queryset)
        if estimate is not None:
            return estimate
    return _plan_estimate(queryset)


class EstimatedCountPaginator(Paginator):
    """A Paginator whose count is PostgreSQL's estimate above ESTIMATE_ABOVE rows (`estimated` says so)."""

    estimated = False

    @cached_property
    def count(self) -> int:
        if hasattr(self.object_list, "query"):
            estimate = estimated_count(self.object_list)
            if estimate is not None and estimate > ESTIMATE_ABOVE:
                self.estimated = True
                return estimate
        return super().count


class FleetScaleAdminMixin:
    """For a ModelAdmin over a table that grows with the fleet or with history: pages counted by estimate,
    and no second COUNT(*) of the whole table for "N of M selected"."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False

"""Operator console for billing: statements (finalise, export, adjust), usage, runs (rate cards: pricing.admin).

State is never edited here: statements are made, finalised and adjusted through billing.services;
a finalised statement is read-only (and the database refuses changes anyway).
"""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.forms.models import BaseInlineFormSet
from django.http import HttpResponse, StreamingHttpResponse
from django.utils import timezone

from core.admin_paging import FleetScaleAdminMixin
from core.admin_permissions import ReadOnlyAdminMixin, ReadOnlyInline
from tenancy.roles import operator_can

from . import charts, exports, services
from .choices import STATEMENT_AMOUNTS, RunKind, StatementState
from .models import (
    BillingRun,
    MeteringWatermark,
    MonthNotEnded,
    Statement,
    StatementLine,
    UsageRecord,
)
from .periods import floor_hour, parse_period

# --- Statements -----------------------------------------------------------------------------------


class StatementLineInline(ReadOnlyInline):
    model = StatementLine
    fk_name = "statement"
    verbose_name_plural = "lines"
    fields = [
        "line_type",
        "description",
        *StatementLine.FIGURE_FIELDS,
        "reason",
        "created_by",
    ]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("created_by")

    def has_change_permission(self, request, obj=None):
        return False


class AdjustmentFormSet(BaseInlineFormSet):
    """Its forms are never saved as such: StatementAdmin.save_formset books each through the service."""


class AdjustmentInline(admin.TabularInline):
    """Add adjustments (amount + reason). On a finalised statement the service books it in the next month."""

    model = StatementLine
    formset = AdjustmentFormSet
    fk_name = "statement"
    verbose_name = "new adjustment"
    verbose_name_plural = "add an adjustment (positive charges, negative credits; on a finalised statement it "
    verbose_name_plural += "becomes a correction in the next month)"
    fields = ["amount", "reason"]
    extra = 1
    can_delete = False

    def get_queryset(self, request):
        return super().get_queryset(request).none()

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Statement)
class StatementAdmin(FleetScaleAdminMixin, admin.ModelAdmin):
    list_display = [
        "project",
        "month",
        "state",
        "currency",
        *STATEMENT_AMOUNTS,
        "line_count",
    ]
    list_filter = ["state", "period"]
    list_select_related = ["project"]
    search_fields = ["project__name", "project__slug", "project__cost_centre"]
    readonly_fields = ["project", *Statement.SUMMARY_FIELDS, "finalised_by", "daily_cost_chart"]
    fields = readonly_fields
    inlines = [StatementLineInline, AdjustmentInline]
    actions = ["finalise", "regenerate", "export_csv", "export_json"]
    ordering = ["-period", "project__slug"]

    def get_queryset(self, request):
        # A correlated subquery, not a JOIN: joining and grouping every statement's lines before the page
        # is cut reads all of a fleet's lines; this counts the shown statements' lines only.
        lines = StatementLine.objects.filter(statement=OuterRef("pk")).order_by().values("statement")
        count = Subquery(lines.annotate(n=Count("pk")).values("n"), output_field=IntegerField())
        return super().get_queryset(request).annotate(line_count=Coalesce(count, 0))

    @admin.display(description="month", ordering="period")
    def month(self, obj):
        return f"{obj.period:%Y-%m}"

    @admin.display(description="lines", ordering="line_count")
    def line_count(self, obj):
        return obj.line_count

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return (obj is None or not obj.is_finalised) and super().has_delete_permission(request, obj)

    def has_finalise_permission(self, request) -> bool:
        return operator_can(request.user, "billing.finalise_statement")

    def save_model(self, request, obj, form, change):
        """Nothing on the statement itself is editable; only adjustments are added (save_formset)."""

    def save_formset(self, request, form, formset, change):
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
        if not isinstance(formset, AdjustmentFormSet):
            return  # the read-only lines: nothing to save
        added = 0
        for line_form in formset.forms:
            if not line_form.has_changed() or not line_form.cleaned_data or line_form.cleaned_data.get("DELETE"):
                continue
            line = services.add_adjustment(
                form.instance,
                amount=line_form.cleaned_data["amount"],
                reason=line_form.cleaned_data["reason"],
                actor=request.user,
            )
            added += 1
            if line.statement_id != form.instance.pk:
                self.message_user(
                    request, f"The statement is finalised: the correction went to {line.statement}.", messages.WARNING
                )
        if added:
            self.message_user(request, f"{added} adjustment(s) added.")

    @admin.display(description="daily cost (reserved vs used)")
    def daily_cost_chart(self, obj):
        return charts.daily_chart_svg(charts.daily_costs(obj.project_id, obj.period), obj.currency)

    @admin.action(description="Finalise selected drafts (they never change afterwards)", permissions=["finalise"])
    def finalise(self, request, queryset):
        done, refused = services.finalise_statements(
            queryset.filter(state=StatementState.DRAFT).select_related("project"), actor=request.user
        )
        self.message_user(request, f"{done} statement(s) finalised.")
        for why in refused:
            self.message_user(request, f"Not finalised: {why}", messages.ERROR)

    @admin.action(description="Regenerate selected drafts from usage", permissions=["change"])
    def regenerate(self, request, queryset):
        done = 0
        for period in sorted(set(queryset.filter(state=StatementState.DRAFT).values_list("period", flat=True))):
            project_ids = list(
                queryset.filter(state=StatementState.DRAFT, period=period).values_list("project_id", flat=True)
            )
            done += len(services.generate_statements(period, project_ids=project_ids))
        self.message_user(request, f"{done} statement(s) regenerated.")

    @admin.action(description="Export selected as CSV", permissions=["view"])
    def export_csv(self, request, queryset):
        statements = exports.statements_for_export(queryset)
        response = StreamingHttpResponse(exports.iter_csv(statements), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{exports.filename(statements, "csv")}"'
        return response

    @admin.action(description="Export selected as JSON", permissions=["view"])
    def export_json(self, request, queryset):
        import json

        statements = list(exports.statements_for_export(queryset))
        response = HttpResponse(json.dumps(exports.to_json(statements), indent=2), content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="{exports.filename(statements, "json")}"'
        return response


# --- Usage records ----------------------------------------------------------------------------------


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyAdminMixin, FleetScaleAdminMixin, admin.ModelAdmin):
    list_display = [
        "hour",
        "project",
        "pool",
        "allocation_id",
        "spec",
        "seconds",
        "failed_credit_seconds",
        "health_credit_seconds",
        "hourly_rate",
        "reserved",
        "sm_activity",
        "energy_kwh",
    ]
    list_filter = ["kind", "product"]
    list_select_related = ["project", "pool__project"]  # the pool's name is project/pool
    search_fields = ["project__slug", "pool__name"]

    @admin.display(description="spec")
    def spec(self, obj):
        return obj.spec.label()

    @admin.display(description="reserved")
    def reserved(self, obj):
        return f"{obj.reserved_amount:.4f}"


# --- Runs -------------------------------------------------------------------------------------------


class CloseMonthForm(forms.ModelForm):
    month = forms.CharField(help_text='The month to close, "YYYY-MM" (UTC).')

    class Meta:
        model = BillingRun
        fields = []

    def clean_month(self):
        try:
            period = parse_period(self.cleaned_data["month"])
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        try:
            services.ensure_month_ended(period)
        except MonthNotEnded as exc:
            raise forms.ValidationError(str(exc)) from None
        return period


@admin.register(BillingRun)
class BillingRunAdmin(admin.ModelAdmin):
    """Adding a run closes a month in the background (meter up to its end, draft every project's statement)."""

    list_display = [
        "started_at",
        "kind",
        "period",
        "status",
        "duration",
        "hours_metered",
        "records_written",
        "statements",
        "metered_until",
        "requested_by",
    ]
    list_filter = ["kind", "status"]
    list_select_related = ["requested_by"]
    search_fields = ["error", "task_id"]

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = CloseMonthForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["month"]
        return super().get_fields(request, obj)

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        return [f.name for f in BillingRun._meta.fields]

    @admin.display(description="duration")
    def duration(self, obj):
        if obj.finished_at is None:
            return "-"
        return str(timedelta(seconds=round((obj.finished_at - obj.started_at).total_seconds())))

    def save_model(self, request, obj, form, change):
        if change:
            return
        obj.kind = RunKind.CLOSE
        services.start_close_run(form.cleaned_data["month"], actor=request.user, run=obj)
        self.message_user(request, f"Closing {form.cleaned_data['month']:%Y-%m} in the background.")

    def has_change_permission(self, request, obj=None):
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(MeteringWatermark)
class MeteringWatermarkAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Where metering stands: every hour before metered_until has been metered."""

    list_display = ["metered_until", "updated_at", "behind"]
    search_fields = ["id"]

    @admin.display(description="hours behind")
    def behind(self, obj):
        return max(0, int((floor_hour(timezone.now()) - obj.metered_until).total_seconds() // 3600))

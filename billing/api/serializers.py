"""Serializers of the billing API. Money is a decimal string, never a float."""

from __future__ import annotations

from decimal import Decimal

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from capacity.api.strict import StrictModelSerializer, StrictSerializer
from pricing.models import RateCard, RateCardEntry
from tenancy.models import Project

from .. import exports
from ..choices import METERED_COLUMNS
from ..models import BillingRun, Statement, StatementLine, UsageRecord
from ..periods import PERIOD_SCHEMA, parse_period


class RateCardEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = RateCardEntry
        fields = ["kind", "product", "profile_name", "replicas", "hourly_price", "is_override", "rule"]


class RateCardSerializer(serializers.ModelSerializer):
    entries = RateCardEntrySerializer(many=True, read_only=True)

    class Meta:
        model = RateCard
        fields = [
            "id",
            "name",
            "currency",
            "effective_from",
            "notes",
            "off_peak_start_hour",
            "off_peak_end_hour",
            "off_peak_multiplier",
            "vgpu_licence_hourly",
            "entries",
        ]


class UsageRecordSerializer(serializers.ModelSerializer):
    reserved_amount = serializers.DecimalField(max_digits=24, decimal_places=10, read_only=True)
    used_amount = serializers.DecimalField(max_digits=24, decimal_places=10, read_only=True, allow_null=True)

    class Meta:
        model = UsageRecord
        fields = [
            "id",
            "allocation",
            "hour",
            "project",
            "pool",
            *METERED_COLUMNS,
            "rate_card",
            "reserved_amount",
            "used_amount",
            "sm_activity",
            "energy_kwh",
        ]


class StatementLineSerializer(serializers.ModelSerializer):
    pool_name = serializers.CharField(source="pool.name", read_only=True, default="")

    class Meta:
        model = StatementLine
        fields = [
            "id",
            "line_type",
            "pool",
            "pool_name",
            *StatementLine.SPEC_FIELDS,
            *StatementLine.FIGURE_FIELDS,
            "reason",
            "usage_period",
            "corrects",
            "created_at",
        ]


class StatementSerializer(serializers.ModelSerializer):
    project_slug = serializers.CharField(source="project.slug", read_only=True)

    class Meta:
        model = Statement
        fields = ["id", "project", "project_slug", *Statement.SUMMARY_FIELDS]


class StatementDetailSerializer(StatementSerializer):
    lines = StatementLineSerializer(many=True, read_only=True)

    class Meta(StatementSerializer.Meta):
        fields = [*StatementSerializer.Meta.fields, "lines"]


@extend_schema_field(PERIOD_SCHEMA)
class PeriodField(serializers.CharField):
    """A month, "YYYY-MM"."""

    def to_internal_value(self, data):
        text = super().to_internal_value(data)
        try:
            return parse_period(text)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


class GenerateStatementSerializer(StrictSerializer):
    project = serializers.SlugRelatedField(slug_field="slug", queryset=Project.objects.all())
    period = PeriodField(help_text='The month, "YYYY-MM" (UTC).')


class AdjustmentSerializer(StrictSerializer):
    amount = serializers.DecimalField(
        max_digits=14, decimal_places=2, help_text="Positive charges, negative credits; whole cents."
    )
    reason = serializers.CharField(max_length=2000, help_text="Why; shown on the statement.")

    def validate_amount(self, value: Decimal) -> Decimal:
        if value == 0:
            raise serializers.ValidationError("An adjustment of zero changes nothing.")
        return value

    def validate_reason(self, value: str) -> str:
        if not value.strip():
            raise serializers.ValidationError("Give a reason.")
        return value.strip()


class BillingRunSerializer(StrictModelSerializer):
    period = PeriodField(write_only=False, help_text='The month to close, "YYYY-MM" (UTC).')

    class Meta:
        model = BillingRun
        fields = [
            "id",
            "kind",
            "period",
            "status",
            "started_at",
            "finished_at",
            "hours_metered",
            "records_written",
            "statements",
            "metered_until",
            "error",
            "task_id",
        ]
        read_only_fields = [f for f in fields if f != "period"]

    def to_representation(self, instance):
        data = super().to_representation(instance)
        data["period"] = f"{instance.period:%Y-%m}" if instance.period else None
        return data


# --- Export (documentation of billing.exports.to_json: what the JSON export really holds) ----------

EXPORT_LINE_FIELDS = exports.CSV_COLUMNS  # the same rows as the CSV, usage_period included


class ExportLineSerializer(serializers.Serializer):
    """One line, as the CSV row but typed: every value a string, null where the CSV cell is empty."""

    def get_fields(self):
        return {name: serializers.CharField(allow_null=True) for name in EXPORT_LINE_FIELDS}


class ExportStatementSerializer(serializers.Serializer):
    """One statement of the JSON export: totals as decimal strings, then its lines."""

    id = serializers.IntegerField()
    project = serializers.CharField(help_text="Project slug.")
    period = serializers.CharField(help_text="YYYY-MM")
    state = serializers.CharField()
    currency = serializers.CharField()
    reserved_hours = serializers.CharField(allow_null=True)
    reserved_amount = serializers.CharField(allow_null=True)
    credit_amount = serializers.CharField(allow_null=True)
    adjustment_amount = serializers.CharField(allow_null=True)
    total_amount = serializers.CharField(allow_null=True)
    used_amount = serializers.CharField(allow_null=True)
    idle_amount = serializers.CharField(allow_null=True)
    unmeasured_amount = serializers.CharField(allow_null=True)
    energy_kwh = serializers.CharField(allow_null=True)
    finalised_at = serializers.DateTimeField(allow_null=True)
    lines = ExportLineSerializer(many=True)


class StatementConflictSerializer(serializers.Serializer):
    detail = serializers.CharField()

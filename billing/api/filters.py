"""FilterSets of the billing API. They only narrow what the caller may see already."""

from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema_field

from capacity.api.strict import IsoDateTimeFilter
from capacity.choices import SpecKind
from pricing.models import RateCard

from ..choices import RunKind, RunStatus, StatementState
from ..models import BillingRun, Statement, UsageRecord
from ..periods import PERIOD_SCHEMA, parse_period


@extend_schema_field(PERIOD_SCHEMA)
class PeriodFilter(filters.CharFilter):
    """A month as YYYY-MM (or its first day); anything else is a 400 naming the field."""

    def filter(self, qs, value):
        if value in (None, ""):
            return qs
        try:
            period = parse_period(value)
        except ValueError as exc:
            from rest_framework.exceptions import ValidationError

            raise ValidationError({self.field_name: [str(exc)]}) from None
        return qs.filter(**{self.field_name: period})


class RateCardFilter(filters.FilterSet):
    effective_after = IsoDateTimeFilter(field_name="effective_from", lookup_expr="gte")
    effective_before = IsoDateTimeFilter(field_name="effective_from", lookup_expr="lt")

    class Meta:
        model = RateCard
        fields = ["effective_after", "effective_before"]


class UsageRecordFilter(filters.FilterSet):
    project = filters.NumberFilter(field_name="project_id")
    project_slug = filters.CharFilter(field_name="project__slug")
    pool = filters.NumberFilter(field_name="pool_id")
    allocation = filters.NumberFilter(field_name="allocation_id")
    kind = filters.ChoiceFilter(choices=SpecKind.choices)
    product = filters.CharFilter()
    profile_name = filters.CharFilter()
    hour_after = IsoDateTimeFilter(field_name="hour", lookup_expr="gte")
    hour_before = IsoDateTimeFilter(field_name="hour", lookup_expr="lt")

    class Meta:
        model = UsageRecord
        fields = [
            "project",
            "project_slug",
            "pool",
            "allocation",
            "kind",
            "product",
            "profile_name",
            "hour_after",
            "hour_before",
        ]


class StatementFilter(filters.FilterSet):
    project = filters.NumberFilter(field_name="project_id")
    project_slug = filters.CharFilter(field_name="project__slug")
    period = PeriodFilter(field_name="period")
    state = filters.ChoiceFilter(choices=StatementState.choices)

    class Meta:
        model = Statement
        fields = ["project", "project_slug", "period", "state"]


class BillingRunFilter(filters.FilterSet):
    kind = filters.ChoiceFilter(choices=RunKind.choices)
    status = filters.ChoiceFilter(choices=RunStatus.choices)
    period = PeriodFilter(field_name="period")

    class Meta:
        model = BillingRun
        fields = ["kind", "status", "period"]

"""FilterSets of the monitoring API: they only narrow what the caller may already see."""

from django_filters import rest_framework as filters

from capacity.api.strict import IsoDateTimeFilter

from ..choices import HealthLevel, HealthRule, IdleState, MetricSource, TrespassKind
from ..models import HealthEvent, IdleReservation, Series, TrespassEvent


class SeriesFilter(filters.FilterSet):
    cluster = filters.CharFilter(field_name="gpu__node__cluster__name")
    node = filters.CharFilter(field_name="gpu__node__name")
    gpu = filters.CharFilter(field_name="gpu__uuid", help_text="GPU UUID")
    mig_instance = filters.CharFilter(field_name="mig_instance__uuid", help_text="MIG instance UUID")
    kind = filters.ChoiceFilter(
        choices=[("gpu", "GPU"), ("mig", "MIG instance"), ("vgpu", "vGPU")], method="filter_kind"
    )
    source = filters.ChoiceFilter(choices=MetricSource.choices)

    class Meta:
        model = Series
        fields = ["cluster", "node", "gpu", "mig_instance", "kind", "source"]

    def filter_kind(self, queryset, name, value):
        return {"gpu": queryset.gpus, "mig": queryset.mig_instances, "vgpu": queryset.vgpus}[value]()


class HealthEventFilter(filters.FilterSet):
    level = filters.MultipleChoiceFilter(choices=HealthLevel.choices)
    rule = filters.MultipleChoiceFilter(choices=HealthRule.choices)
    open = filters.BooleanFilter(field_name="resolved_at", lookup_expr="isnull", help_text="true: unresolved only")
    cluster = filters.CharFilter(field_name="gpu__node__cluster__name")
    node = filters.CharFilter(field_name="gpu__node__name")
    gpu = filters.CharFilter(field_name="gpu__uuid")
    mig_instance = filters.CharFilter(field_name="mig_instance__uuid")
    opened_after = IsoDateTimeFilter(field_name="opened_at", lookup_expr="gte")
    opened_before = IsoDateTimeFilter(field_name="opened_at", lookup_expr="lt")

    class Meta:
        model = HealthEvent
        fields = ["level", "rule", "open", "cluster", "node", "gpu", "mig_instance", "opened_after", "opened_before"]


class IdleReservationFilter(filters.FilterSet):
    state = filters.MultipleChoiceFilter(choices=IdleState.choices)
    project = filters.NumberFilter(field_name="allocation__project_id")
    pool = filters.NumberFilter(field_name="allocation__pool_id")

    class Meta:
        model = IdleReservation
        fields = ["state", "project", "pool"]


class TrespassEventFilter(filters.FilterSet):
    kind = filters.MultipleChoiceFilter(choices=TrespassKind.choices)
    open = filters.BooleanFilter(field_name="ended_at", lookup_expr="isnull", help_text="true: open only")
    cluster = filters.CharFilter(field_name="gpu__node__cluster__name")
    started_after = IsoDateTimeFilter(field_name="started_at", lookup_expr="gte")
    started_before = IsoDateTimeFilter(field_name="started_at", lookup_expr="lt")

    class Meta:
        model = TrespassEvent
        fields = ["kind", "open", "cluster", "started_after", "started_before"]

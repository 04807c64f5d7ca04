"""FilterSets of the pools API. Project filters take ids or slugs and only narrow what the caller may
see already: filtering by another project's id gives an empty list, not an error that confirms it."""

from django_filters import rest_framework as filters

from capacity.api.strict import IsoDateTimeFilter
from capacity.choices import SpecKind
from tenancy.models import Project

from ..choices import BestEffortState, Isolation, PoolState, RequestState, WorkloadType
from ..models import Allocation, BestEffortRequest, GpuPool, PoolRequest


class ProjectFilter(filters.FilterSet):
    slug = filters.CharFilter()
    name = filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Project
        fields = ["slug", "name"]


class PoolRequestFilter(filters.FilterSet):
    project = filters.NumberFilter(field_name="project_id")
    project_slug = filters.CharFilter(field_name="project__slug")
    state = filters.MultipleChoiceFilter(choices=RequestState.choices)
    isolation = filters.ChoiceFilter(choices=Isolation.choices)
    workload_type = filters.ChoiceFilter(choices=WorkloadType.choices)
    tier = filters.CharFilter()
    product = filters.CharFilter()
    profile_name = filters.CharFilter()
    cluster = filters.NumberFilter(field_name="cluster_id")
    created_after = IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = PoolRequest
        fields = [
            "project",
            "project_slug",
            "state",
            "isolation",
            "workload_type",
            "tier",
            "product",
            "profile_name",
            "cluster",
            "created_after",
            "created_before",
        ]


class GpuPoolFilter(filters.FilterSet):
    project = filters.NumberFilter(field_name="project_id")
    project_slug = filters.CharFilter(field_name="project__slug")
    state = filters.MultipleChoiceFilter(choices=PoolState.choices)
    workload_type = filters.ChoiceFilter(choices=WorkloadType.choices)
    tier = filters.CharFilter()
    cluster = filters.NumberFilter(method="filter_cluster", label="Pools with units on this cluster (id)")

    class Meta:
        model = GpuPool
        fields = ["project", "project_slug", "state", "workload_type", "tier", "cluster"]

    def filter_cluster(self, queryset, name, value):
        """A pool across clusters is listed under each of them, not only its home cluster."""
        return queryset.on_cluster(value)


class AllocationFilter(filters.FilterSet):
    project = filters.NumberFilter(field_name="project_id")
    project_slug = filters.CharFilter(field_name="project__slug")
    pool = filters.NumberFilter(field_name="pool_id")
    kind = filters.ChoiceFilter(choices=SpecKind.choices)
    product = filters.CharFilter()
    profile_name = filters.CharFilter()
    cluster = filters.CharFilter(field_name="gpu__node__cluster__name", label="Cluster name")
    active = filters.BooleanFilter(field_name="released_at", lookup_expr="isnull", label="Not released")

    class Meta:
        model = Allocation
        fields = ["project", "project_slug", "pool", "kind", "product", "profile_name", "cluster", "active"]


class BestEffortRequestFilter(filters.FilterSet):
    project = filters.NumberFilter(field_name="project_id")
    state = filters.ChoiceFilter(choices=BestEffortState.choices)

    class Meta:
        model = BestEffortRequest
        fields = ["project", "state"]

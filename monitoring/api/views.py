"""Monitoring API: partition metrics, pool utilisation, health events, idle reservations.

Visibility: operators (staff) read everything. A project member reads the series of the MIG
instances and full GPUs their projects hold or held, and only the points inside their own
allocation windows; time-sliced GPUs are shared, so their GPU-level series are operator-only.
Health events are visible to the projects that held an affected unit while the event was open.
Anything else is not found (404) or absent from lists. Every view is project-scoped through
ProjectScopedQuerysetMixin; series and health events set project_lookup = None, so the models'
QuerySet.visible_to(user) decides.
"""

from __future__ import annotations

from django.db.models import Count, Q
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from capacity.choices import SpecKind
from core.permissions import ProjectScopedQuerysetMixin
from pools.api.filters import GpuPoolFilter
from pools.api.views import GpuPoolViewSet
from pools.models import Allocation, GpuPool
from tenancy.roles import projects_for, sees_all_projects

from .. import readers
from ..models import HealthEvent, IdleReservation, Series, TrespassEvent
from ..readers.cards import with_utilisation
from . import filters, serializers


def allocation_windows(user, series: Series) -> list[readers.Window] | None:
    """The periods `user`'s projects held the unit behind `series`; None for operators (no limit)."""
    if sees_all_projects(user):
        return None
    held = Allocation.objects.filter(project__in=projects_for(user).values("pk"))
    if series.mig_instance_id:
        held = held.filter(kind=SpecKind.MIG, mig_instance_id=series.mig_instance_id)
    else:
        held = held.filter(kind=SpecKind.FULL, gpu_id=series.gpu_id)
    return list(held.order_by("allocated_at").values_list("allocated_at", "released_at"))


RANGE_PARAMETERS = [
    OpenApiParameter("start", OpenApiTypes.DATETIME, description="ISO 8601; default end - 24 h."),
    OpenApiParameter("end", OpenApiTypes.DATETIME, description="ISO 8601; default now."),
    OpenApiParameter(
        "step", str, enum=["auto", "raw", "5m", "1h"], description="auto: raw up to 2 h, 5m up to 3 days, 1h beyond."
    ),
]


@extend_schema_view(
    list=extend_schema(summary="Metric series I may read (GPUs and MIG instances)"),
    retrieve=extend_schema(summary="One metric series"),
)
class SeriesViewSet(ProjectScopedQuerysetMixin, viewsets.ReadOnlyModelViewSet):
    project_lookup = None  # rows reach projects through allocations: Series.objects.visible_to(user)
    queryset = Series.objects.select_related("gpu__node__cluster", "mig_instance__profile").order_by("id")
    serializer_class = serializers.SeriesSerializer
    filterset_class = filters.SeriesFilter
    ordering_fields = ["id"]

    @extend_schema(
        summary="Samples of a series over a time range",
        parameters=[
            *RANGE_PARAMETERS,
            OpenApiParameter("aggregate", str, enum=list(readers.AGGREGATES), description="Of rollup buckets."),
            OpenApiParameter("metrics", str, many=True, enum=list(readers.METRICS), description="Default: all."),
        ],
        responses=serializers.SeriesSamplesSerializer,
    )
    @action(detail=True, methods=["get"])
    def samples(self, request, pk=None):
        series = self.get_object()
        query = serializers.SampleQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        q = query.validated_data
        step = readers.auto_step(q["start"], q["end"]) if q["step"] == "auto" else q["step"]
        metrics = tuple(m for m in readers.METRICS if m in (q.get("metrics") or readers.METRICS))
        windows = allocation_windows(request.user, series)
        points = readers.series_points(
            [series.pk],
            q["start"],
            q["end"],
            step=step,
            aggregate=q["aggregate"],
            metrics=metrics,
            windows=None if windows is None else {series.pk: windows},
        )[series.pk]
        body = {
            "series": series.pk,
            "start": q["start"],
            "end": q["end"],
            "step": step,
            "aggregate": q["aggregate"] if step != "raw" else "raw",
            "points": points,
        }
        return Response(body)  # points carry only the metrics asked for; SeriesSamplesSerializer documents them


@extend_schema_view(
    list=extend_schema(summary="Utilisation of my pools (SM activity over the range)", parameters=RANGE_PARAMETERS),
    retrieve=extend_schema(
        summary="One pool's utilisation: summary and time series (units weighted by compute slices)",
        parameters=RANGE_PARAMETERS,
    ),
)
class PoolUtilisationViewSet(ProjectScopedQuerysetMixin, viewsets.ReadOnlyModelViewSet):
    queryset = GpuPool.objects.all()
    serializer_class = serializers.PoolUtilisationSerializer
    project_lookup = "project"
    ordering_fields = ["id", "created_at"]
    filterset_class = GpuPoolFilter  # the pools API's: `cluster` lists a pool under each of its clusters

    def get_queryset(self):
        return (
            super()
            .get_queryset()
            .with_clusters()
            .select_related("project", "cluster")
            .annotate(open_flags=Count("allocations__idle_flags", filter=Q(allocations__idle_flags__state="open")))
            .order_by("-created_at", "-id")
        )

    def _range(self):
        query = serializers.RangeQuerySerializer(data=self.request.query_params)
        query.is_valid(raise_exception=True)
        q = query.validated_data
        step = readers.auto_step(q["start"], q["end"]) if q["step"] == "auto" else q["step"]
        return q["start"], q["end"], step

    def _summary(self, pool, start, end, step, *, points: bool) -> dict:
        data = readers.pool_utilisation(pool, start, end, step=step)
        body = {
            "pool": pool.pk,
            "name": pool.name,
            "project": pool.project.slug,
            "cluster": pool.cluster.name,
            "clusters": list(pool.pool_clusters.all()),
            "state": pool.state,
            "units": data["units"],
            "measured_units": data["measured_units"],
            "sm_active_avg": data["sm_active_avg"],
            "open_health_events": open_events_of_pool(pool),
            "open_idle_flags": pool.open_flags,
            "start": start,
            "end": end,
            "step": step,
        }
        if points:
            body["points"] = data["points"]
            body["pods"] = readers.pool_pods(pool, start, end)
        return body

    def list(self, request, *args, **kwargs):
        start, end, step = self._range()
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        rows = [self._summary(pool, start, end, "1h" if step == "raw" else step, points=False) for pool in page]
        return self.get_paginated_response(serializers.PoolUtilisationSerializer(rows, many=True).data)

    def retrieve(self, request, *args, **kwargs):
        start, end, step = self._range()
        pool = self.get_object()
        return Response(serializers.PoolUtilisationSerializer(self._summary(pool, start, end, step, points=True)).data)


# /api/v1/pools/: the pools API's pools with their cards' utilisation, which is monitoring's data, so the route
# is registered here (monitoring/api/urls.py) rather than in pools, which does not read monitoring. No docstring:
# the schema's descriptions stay GpuPoolViewSet's.
class PoolCardViewSet(GpuPoolViewSet):
    def get_queryset(self):
        return with_utilisation(super().get_queryset())


def open_events_of_pool(pool) -> int:
    """Open health events on the units the pool holds now (GPU-level events count for its MIG units)."""
    active = Allocation.objects.filter(pool=pool, released_at__isnull=True)
    return (
        HealthEvent.objects.open()
        .filter(
            Q(mig_instance__isnull=True, gpu__in=active.values("gpu"))
            | Q(mig_instance__in=active.exclude(mig_instance__isnull=True).values("mig_instance"))
        )
        .count()
    )


@extend_schema_view(
    list=extend_schema(summary="Health events on GPUs and MIG instances I may see"),
    retrieve=extend_schema(summary="One health event"),
)
class HealthEventViewSet(ProjectScopedQuerysetMixin, viewsets.ReadOnlyModelViewSet):
    project_lookup = None  # rows reach projects through allocations: HealthEvent.objects.visible_to(user)
    queryset = HealthEvent.objects.select_related("gpu__node__cluster", "mig_instance__profile").order_by(
        "-opened_at", "-id"
    )
    serializer_class = serializers.HealthEventSerializer
    filterset_class = filters.HealthEventFilter
    ordering_fields = ["opened_at", "last_seen_at", "level"]


@extend_schema_view(
    list=extend_schema(summary="Idle reservations of my projects (release/downsize proposals)"),
    retrieve=extend_schema(summary="One idle reservation"),
)
class IdleReservationViewSet(ProjectScopedQuerysetMixin, viewsets.ReadOnlyModelViewSet):
    queryset = IdleReservation.objects.select_related("allocation__project", "allocation__gpu").order_by(
        "-detected_at", "-id"
    )
    serializer_class = serializers.IdleReservationSerializer
    filterset_class = filters.IdleReservationFilter
    project_lookup = "allocation__project"
    ordering_fields = ["detected_at", "sm_active_avg"]


@extend_schema_view(
    list=extend_schema(summary="Trespass events on my units or by my pods"),
    retrieve=extend_schema(summary="One trespass event"),
)
class TrespassEventViewSet(ProjectScopedQuerysetMixin, viewsets.ReadOnlyModelViewSet):
    """Operators see every event; a member sees those on its projects' units and those by its projects' pods."""

    project_lookup = None  # two projects per row (owner and trespasser): TrespassEvent.objects.visible_to(user)
    queryset = TrespassEvent.objects.select_related(
        "gpu__node__cluster", "mig_instance__profile", "owner_project", "project"
    ).order_by("-started_at", "-id")
    serializer_class = serializers.TrespassEventSerializer
    filterset_class = filters.TrespassEventFilter
    ordering_fields = ["started_at", "ended_at"]

    def get_serializer_context(self):
        context = super().get_serializer_context()
        user = self.request.user
        context["visible_project_ids"] = (
            None if sees_all_projects(user) else set(projects_for(user).values_list("pk", flat=True))
        )
        return context

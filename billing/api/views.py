"""Billing API: rate cards, usage records, statements (with CSV/JSON export) and month-close runs.

Visibility comes from ProjectScopedQuerysetMixin: members see their own projects' usage and
statements, another project's statement is a 404; operators (staff) see the fleet. Only operators
generate, finalise and adjust statements and close months (scope=Scope.OPERATOR). Rate cards are
prices, readable by every signed-in user. A finalised statement is a 409.
"""

from __future__ import annotations

import json

from django.db.models import Prefetch
from django.http import HttpResponse, HttpResponseBase, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from capacity.api.strict import reject_body
from core.api import Conflict
from core.permissions import ProjectScopedQuerysetMixin
from core.scopes import Scope

from .. import exports, services
from ..models import (
    BillingRun,
    MonthNotEnded,
    RateCard,
    RateCardEntry,
    Statement,
    StatementLine,
    UsageRecord,
)
from . import filters, serializers

CONFLICT = OpenApiResponse(serializers.StatementConflictSerializer, description="The statement is finalised.")
FMT = OpenApiParameter(
    "fmt", str, OpenApiParameter.QUERY, enum=["csv", "json"], default="csv", description="Export format."
)
EXPORT_RESPONSES = {
    (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="One row per line (fmt=csv, the default)."),
    (200, "application/json"): OpenApiResponse(
        serializers.ExportStatementSerializer(many=True), description="Statements with totals and lines (fmt=json)."
    ),
}


def export_response(statements, fmt: str) -> HttpResponseBase:
    """The `statements` queryset as JSON, or as CSV streamed (billing.exports.iter_csv)."""
    if fmt == "json":
        body = json.dumps(exports.to_json(list(statements)), indent=2)
        response = HttpResponse(body, content_type="application/json")
        extension = "json"
    elif fmt == "csv":
        response = StreamingHttpResponse(exports.iter_csv(statements), content_type="text/csv; charset=utf-8")
        extension = "csv"
    else:
        raise exceptions.ValidationError({"fmt": ['Use "csv" or "json".']})
    response["Content-Disposition"] = f'attachment; filename="{exports.filename(statements, extension)}"'
    return response


@extend_schema_view(
    list=extend_schema(summary="Rate cards, newest first, with their prices per spec"),
    retrieve=extend_schema(summary="One rate card"),
)
class RateCardViewSet(viewsets.ReadOnlyModelViewSet):
    """Prices are public to every signed-in user; cards are made in the admin."""

    scope = Scope.SIGNED_IN

    queryset = RateCard.objects.prefetch_related(
        Prefetch("entries", queryset=RateCardEntry.objects.order_by("product", "kind", "profile_name", "replicas"))
    ).order_by("-effective_from")
    serializer_class = serializers.RateCardSerializer
    filterset_class = filters.RateCardFilter
    ordering_fields = ["effective_from"]


@extend_schema_view(
    list=extend_schema(summary="Hourly usage records of my projects (showback: reserved vs measured)"),
    retrieve=extend_schema(summary="One usage record"),
)
class UsageRecordViewSet(ProjectScopedQuerysetMixin, viewsets.ReadOnlyModelViewSet):
    queryset = UsageRecord.objects.order_by("-hour", "allocation_id")
    serializer_class = serializers.UsageRecordSerializer
    filterset_class = filters.UsageRecordFilter
    ordering_fields = ["hour", "allocation"]


@extend_schema_view(
    list=extend_schema(summary="Monthly statements of my projects"),
    retrieve=extend_schema(summary="One statement with its lines"),
)
class StatementViewSet(ProjectScopedQuerysetMixin, viewsets.ReadOnlyModelViewSet):
    queryset = Statement.objects.select_related("project").order_by("-period", "project__slug")
    serializer_class = serializers.StatementSerializer
    filterset_class = filters.StatementFilter
    ordering_fields = ["period", "total_amount"]
    # The operator actions' permissions (OperatorPermissions reads these; the reads are project-scoped).
    operator_perms = {
        "generate": ("billing.add_statement", "billing.change_statement"),
        "finalise": ("billing.finalise_statement",),
        "adjust": ("billing.add_statementline",),
    }

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action != "list":
            lines = StatementLine.objects.select_related("pool").order_by(*StatementLine._meta.ordering)
            queryset = queryset.prefetch_related(Prefetch("lines", queryset=lines))
        return queryset

    def get_serializer_class(self):
        if self.action == "list":
            return serializers.StatementSerializer
        return serializers.StatementDetailSerializer

    @extend_schema(
        summary="Export the statements I can see (operators: the fleet) as CSV or JSON",
        parameters=[FMT],
        responses=EXPORT_RESPONSES,
    )
    @action(detail=False, methods=["get"], url_path="export", pagination_class=None)
    def export(self, request):
        statements = exports.statements_for_export(self.filter_queryset(self.get_queryset()))
        return export_response(statements, request.query_params.get("fmt", "csv"))

    @extend_schema(summary="Export one statement as CSV or JSON", parameters=[FMT], responses=EXPORT_RESPONSES)
    @action(detail=True, methods=["get"], url_path="download", filterset_class=None, pagination_class=None)
    def download(self, request, pk=None):
        statement = self.get_object()
        return export_response(
            exports.statements_for_export(Statement.objects.filter(pk=statement.pk)),
            request.query_params.get("fmt", "csv"),
        )

    @extend_schema(
        summary="Make or refresh a project's draft statement for a month (operators)",
        request=serializers.GenerateStatementSerializer,
        responses={200: serializers.StatementDetailSerializer, 409: CONFLICT},
    )
    @action(detail=False, methods=["post"], filterset_class=None, scope=Scope.OPERATOR)
    def generate(self, request):
        serializer = serializers.GenerateStatementSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        project, period = serializer.validated_data["project"], serializer.validated_data["period"]
        existing = Statement.objects.filter(project=project, period=period).first()
        if existing is not None and existing.is_finalised:
            raise Conflict(f"The {period:%Y-%m} statement of {project.slug} is finalised; adjust the next one.")
        statement = services.generate_statement(project, period)
        return Response(self._detail(statement))

    @extend_schema(
        summary="Finalise a draft statement (operators); it never changes afterwards",
        description="Refused (400) while the statement's month has not ended; 409 when already finalised.",
        request=None,
        responses={
            200: serializers.StatementDetailSerializer,
            400: OpenApiResponse(description="The month has not ended."),
            409: CONFLICT,
        },
    )
    @action(detail=True, methods=["post"], filterset_class=None, scope=Scope.OPERATOR)
    def finalise(self, request, pk=None):
        statement = self.get_object()
        reject_body(request)
        try:
            services.finalise_statement(statement, actor=request.user)
        except MonthNotEnded as exc:
            raise exceptions.ValidationError({"period": [str(exc)]}) from None
        return Response(self._detail(statement))

    @extend_schema(
        summary="Add an adjustment with a reason (operators); on a finalised statement it goes to the next month",
        request=serializers.AdjustmentSerializer,
        responses={201: serializers.StatementLineSerializer},
    )
    @action(detail=True, methods=["post"], filterset_class=None, scope=Scope.OPERATOR)
    def adjust(self, request, pk=None):
        statement = self.get_object()
        serializer = serializers.AdjustmentSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        line = services.add_adjustment(statement, actor=request.user, **serializer.validated_data)
        data = serializers.StatementLineSerializer(line).data
        return Response({**data, "statement": line.statement_id}, status=status.HTTP_201_CREATED)

    def _detail(self, statement: Statement) -> dict:
        lines = StatementLine.objects.select_related("pool").order_by(*StatementLine._meta.ordering)
        fresh = (
            Statement.objects.select_related("project")
            .prefetch_related(Prefetch("lines", queryset=lines))
            .get(pk=statement.pk)
        )
        return serializers.StatementDetailSerializer(fresh, context=self.get_serializer_context()).data


@extend_schema_view(
    list=extend_schema(summary="Metering passes and month closes (operators)"),
    retrieve=extend_schema(summary="One billing run"),
    create=extend_schema(
        summary="Close a month in the background: meter up to its end, make every project's draft statement",
        responses={202: serializers.BillingRunSerializer, 400: OpenApiResponse(description="Bad or unfinished month.")},
    ),
)
class BillingRunViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    queryset = BillingRun.objects.order_by("-started_at", "-id")
    serializer_class = serializers.BillingRunSerializer
    filterset_class = filters.BillingRunFilter
    scope = Scope.OPERATOR
    ordering_fields = ["started_at"]

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            run = services.start_close_run(serializer.validated_data["period"], actor=request.user)
        except MonthNotEnded as exc:
            raise exceptions.ValidationError({"period": [str(exc)]}) from None
        return Response(self.get_serializer(run).data, status=status.HTTP_202_ACCEPTED)

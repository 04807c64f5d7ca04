"""Self-service API of pool requests: create, dry run, forecast, the workflow's actions and the queue's, and
operators' auto-approval policies. Visibility and roles as in pools.api.views."""

from __future__ import annotations

from django.db.models import Prefetch
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from core.api import Conflict, usernames_only
from core.permissions import ProjectScopedQuerysetMixin
from core.scopes import Scope

from .. import forecast, queue, queue_order, services
from ..models import AutoApprovalPolicy, PoolRequest, PoolRequestTransition
from ..services import declarations
from . import filters, request_serializers
from .views import CONFLICT, require_project_perm, validated_body


@extend_schema_view(
    list=extend_schema(summary="Pool requests of my projects"),
    retrieve=extend_schema(summary="One pool request, with its transitions"),
    create=extend_schema(
        summary="Request GPU capacity (a draft, or submitted at once with submit=true)",
        responses={201: request_serializers.PoolRequestDetailSerializer},
    ),
)
class PoolRequestViewSet(
    ProjectScopedQuerysetMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    queryset = PoolRequest.objects.select_related(
        "project", "cluster", "requested_by", "approved_by", "approved_by_policy", "pool", "queue_entry"
    )
    serializer_class = request_serializers.PoolRequestSerializer
    filterset_class = filters.PoolRequestFilter
    ordering_fields = ["created_at", "id", "state", "start_at", "end_at"]
    APPROVERS = ("pools.approve_poolrequest",)
    operator_perms = {
        "approve": APPROVERS,
        "reject": APPROVERS,
        "hold": APPROVERS,
        "unhold": APPROVERS,
        "move": APPROVERS,
        "cancel": APPROVERS,
    }

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action in ("list", "waiting"):  # rows to show, not to act on: a user is their username
            queryset = queryset.defer(*usernames_only("requested_by", "approved_by"))
        if self.action != "list":
            transitions = PoolRequestTransition.objects.select_related("actor")
            queryset = queryset.prefetch_related(Prefetch("transitions", queryset=transitions))
        return queryset

    def get_serializer_class(self):
        if self.action == "list":
            return request_serializers.PoolRequestSerializer
        return request_serializers.PoolRequestDetailSerializer

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        created = serializer.save()
        return Response(self._detail(created), status=status.HTTP_201_CREATED)

    def _detail(self, obj: PoolRequest) -> dict:
        fresh = self.get_queryset().get(pk=obj.pk)
        context = self.get_serializer_context()
        if fresh.state == "queued":
            context["queue_positions"] = {fresh.pk: queue_order.position_of(fresh)}
        return request_serializers.PoolRequestDetailSerializer(fresh, context=context).data

    def retrieve(self, request, *args, **kwargs):
        return Response(self._detail(self.get_object()))

    def _requester_action(self, perm: str = "request_capacity") -> PoolRequest:
        obj = self.get_object()
        require_project_perm(self.request.user, obj.project_id, perm, "Your role in this project does not allow this.")
        return obj

    def _reason(self, serializer_class=request_serializers.ReasonSerializer) -> dict:
        return validated_body(self.request, serializer_class)

    @extend_schema(
        summary="Dry run: the offers that meet a declaration, ranked, with prices and a start forecast",
        request=request_serializers.DryRunSerializer,
        responses={200: OpenApiResponse(description="declared, chosen, offers (ranked), rejected (with reasons)")},
    )
    @action(
        detail=False,
        methods=["post"],
        url_path="dry-run",
        filterset_class=None,
        pagination_class=None,
        scope=Scope.SIGNED_IN,
    )
    def dry_run(self, request):
        """Fleet-wide facts and list prices, no one's secret; writes nothing."""
        serializer = request_serializers.DryRunSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        return Response(declarations.dry_run(serializer.validated_data).to_dict())

    @extend_schema(
        summary="Submit a draft for approval",
        request=request_serializers.ReasonSerializer,
        responses={200: request_serializers.PoolRequestDetailSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None)
    def submit(self, request, pk=None):
        obj = self._requester_action()
        services.submit(obj, actor=request.user, reason=self._reason()["reason"])
        queue.after_submit(obj)
        return Response(self._detail(obj))

    @extend_schema(
        summary="Withdraw a draft or submitted request",
        request=request_serializers.ReasonSerializer,
        responses={200: request_serializers.PoolRequestDetailSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None)
    def withdraw(self, request, pk=None):
        obj = self._requester_action()
        services.withdraw(obj, actor=request.user, reason=self._reason()["reason"])
        return Response(self._detail(obj))

    @extend_schema(
        summary="Approve (operators): take units, create the pool, start provisioning; "
        "a request that chose to wait is queued when capacity is short",
        request=request_serializers.ApproveSerializer,
        responses={200: request_serializers.PoolRequestDetailSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None, scope=Scope.OPERATOR)
    def approve(self, request, pk=None):
        obj = self.get_object()
        data = self._reason(request_serializers.ApproveSerializer)
        queue.approve_or_queue(obj, actor=request.user, reason=data["reason"], cluster=data.get("cluster"))
        return Response(self._detail(obj))

    # --- The queue ---------------------------------------------------------------------------------

    @extend_schema(
        summary="The queue: my projects' waiting requests in queue order, with place and forecast",
        responses=request_serializers.PoolRequestSerializer(many=True),
    )
    @action(detail=False, methods=["get"], url_path="queue", pagination_class=None, filterset_class=None)
    def waiting(self, request):
        places = queue_order.ordered()
        visible = {r.pk: r for r in self.get_queryset().filter(pk__in=[p.entry.request_id for p in places])}
        context = {**self.get_serializer_context(), "queue_positions": {p.entry.request_id: p.position for p in places}}
        rows = [visible[p.entry.request_id] for p in places if p.entry.request_id in visible]
        return Response(request_serializers.PoolRequestSerializer(rows, many=True, context=context).data)

    @extend_schema(
        summary='Forecast a request not yet made ("if I asked for 4 x 3g.40gb now"): P50 and P90 start',
        request=request_serializers.ForecastRequestSerializer,
        responses={200: request_serializers.ForecastSerializer},
    )
    @action(detail=False, methods=["post"], url_path="forecast", filterset_class=None)
    def forecast(self, request):
        serializer = request_serializers.ForecastRequestSerializer(
            data=request.data, context=self.get_serializer_context()
        )
        serializer.is_valid(raise_exception=True)
        values = dict(serializer.validated_data)
        values.pop("tags", None)
        estimate = forecast.estimate_start(PoolRequest(**values))
        return Response({"p50": estimate.p50, "p90": estimate.p90, "basis": estimate.basis})

    def _queue_action(self, run, serializer_class=request_serializers.ReasonSerializer) -> Response:
        obj = self.get_object()
        data = self._reason(serializer_class)
        run(obj, data)
        return Response(self._detail(obj))

    @extend_schema(
        summary="Hold a queued request (operators): it keeps its place but is skipped",
        request=request_serializers.ReasonSerializer,
        responses={200: request_serializers.PoolRequestDetailSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None, scope=Scope.OPERATOR)
    def hold(self, request, pk=None):
        return self._queue_action(lambda obj, d: queue.hold(obj, actor=request.user, reason=d["reason"]))

    @extend_schema(
        summary="Release the hold on a queued request (operators)",
        request=request_serializers.ReasonSerializer,
        responses={200: request_serializers.PoolRequestDetailSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None, scope=Scope.OPERATOR)
    def unhold(self, request, pk=None):
        return self._queue_action(lambda obj, d: queue.unhold(obj, actor=request.user, reason=d["reason"]))

    @extend_schema(
        summary="Move a queued request to a place in the queue (operators)",
        request=request_serializers.MoveSerializer,
        responses={200: request_serializers.PoolRequestDetailSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None, scope=Scope.OPERATOR)
    def move(self, request, pk=None):
        return self._queue_action(
            lambda obj, d: queue.move(obj, position=d["position"], actor=request.user, reason=d["reason"]),
            request_serializers.MoveSerializer,
        )

    @extend_schema(
        summary="Cancel a queued request (operators), with a reason",
        request=request_serializers.RejectSerializer,
        responses={200: request_serializers.PoolRequestDetailSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None, scope=Scope.OPERATOR)
    def cancel(self, request, pk=None):
        return self._queue_action(
            lambda obj, d: queue.cancel(obj, actor=request.user, reason=d["reason"]),
            request_serializers.RejectSerializer,
        )

    @extend_schema(
        summary="Reject (operators), with a reason",
        request=request_serializers.RejectSerializer,
        responses={200: request_serializers.PoolRequestDetailSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None, scope=Scope.OPERATOR)
    def reject(self, request, pk=None):
        obj = self.get_object()
        services.reject(obj, actor=request.user, reason=self._reason(request_serializers.RejectSerializer)["reason"])
        return Response(self._detail(obj))

    @extend_schema(
        summary="Release the capacity (operators and project admins): units freed, Kubernetes cleaned up",
        request=request_serializers.ReasonSerializer,
        responses={200: request_serializers.PoolRequestDetailSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None)
    def release(self, request, pk=None):
        obj = self._requester_action("manage_members")
        services.release(obj, actor=request.user, reason=self._reason()["reason"])
        return Response(self._detail(obj))


@extend_schema_view(
    list=extend_schema(summary="Auto-approval policies (operators)"),
    retrieve=extend_schema(summary="One auto-approval policy (operators)"),
    create=extend_schema(summary="Add an auto-approval policy (operators)"),
    update=extend_schema(summary="Change an auto-approval policy (operators)"),
    partial_update=extend_schema(summary="Change part of an auto-approval policy (operators)"),
    destroy=extend_schema(summary="Delete an auto-approval policy (operators); one that approved requests is kept"),
)
class AutoApprovalPolicyViewSet(viewsets.ModelViewSet):
    """Rules under which requests are approved without a person (pools/policies.py)."""

    queryset = AutoApprovalPolicy.objects.prefetch_related("projects").order_by("name", "id")
    serializer_class = request_serializers.AutoApprovalPolicySerializer
    scope = Scope.OPERATOR
    filterset_class = None
    ordering_fields = ["name", "id"]

    def perform_destroy(self, instance: AutoApprovalPolicy) -> None:
        if instance.approved_requests.exists():
            raise Conflict("This policy approved requests and stays on their record: disable it instead.")
        instance.delete()

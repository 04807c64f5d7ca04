"""Self-service API of pool requests: create, the workflow's actions (submit, withdraw, reject, release),
and operators' auto-approval policies. Visibility and roles as in pools.api.views; the queue's actions, the dry
run and the forecast are scheduling's (scheduling/api/views.py registers its subclass in this one's place)."""

from __future__ import annotations

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from core.api import Conflict, usernames_only
from core.permissions import ProjectScopedQuerysetMixin
from core.scopes import Scope

from .. import services, signals
from ..models import AutoApprovalPolicy, PoolRequest, PoolRequestTransition
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
            context["queue_positions"] = {fresh.pk: self.queue_position(fresh)}
        return request_serializers.PoolRequestDetailSerializer(fresh, context=context).data

    def queue_position(self, request: PoolRequest) -> int | None:
        """A queued request's place: the queue's order is scheduling's (scheduling.api.views overrides this)."""
        return None

    def retrieve(self, request, *args, **kwargs):
        return Response(self._detail(self.get_object()))

    def _requester_action(self, perm: str = "request_capacity") -> PoolRequest:
        obj = self.get_object()
        require_project_perm(self.request.user, obj.project_id, perm, "Your role in this project does not allow this.")
        return obj

    def _reason(self, serializer_class=request_serializers.ReasonSerializer) -> dict:
        return validated_body(self.request, serializer_class)

    @extend_schema(
        summary="Submit a draft for approval",
        request=request_serializers.ReasonSerializer,
        responses={200: request_serializers.PoolRequestDetailSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None)
    def submit(self, request, pk=None):
        obj = self._requester_action()
        services.submit(obj, actor=request.user, reason=self._reason()["reason"])
        signals.request_submitted.send(sender=PoolRequest, request=obj)  # scheduling.queue.after_submit
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
    """Rules under which requests are approved without a person (scheduling/policies.py)."""

    queryset = AutoApprovalPolicy.objects.prefetch_related("projects").order_by("name", "id")
    serializer_class = request_serializers.AutoApprovalPolicySerializer
    scope = Scope.OPERATOR
    filterset_class = None
    ordering_fields = ["name", "id"]

    def perform_destroy(self, instance: AutoApprovalPolicy) -> None:
        if instance.approved_requests.exists():
            raise Conflict("This policy approved requests and stays on their record: disable it instead.")
        instance.delete()

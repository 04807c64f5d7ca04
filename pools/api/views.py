"""Self-service API: my projects and their members, pools, allocations, API tokens (pool requests: request_views).

Visibility comes from ProjectScopedQuerysetMixin (core/permissions.py, the API's one choke point): another
project's object is not found (404).
What a visible object allows depends on the caller's role there: viewers read, members
request capacity, project admins also manage members and release; operators (staff holding the
model permissions, e.g. the Operators group) do what their permissions say, and only they approve,
reject (pools.approve_poolrequest) and retry (pools.change_gpupool): those actions declare
scope=Scope.OPERATOR. A refused action on a visible
object is a 403 and changes nothing. Illegal state changes and capacity shortages are 409 (DomainError).
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from capacity.api.strict import reject_body
from core.api import Conflict
from core.permissions import OwnUserQuerysetMixin, ProjectScopedQuerysetMixin
from core.scopes import Scope
from tenancy import roles
from tenancy import services as tenancy_services
from tenancy.models import ApiToken, Project

from .. import lending, services
from ..models import Allocation, BestEffortRequest, GpuPool
from . import filters, request_serializers, serializers


def validated_body(request, serializer_class=request_serializers.ReasonSerializer) -> dict:
    """The request body through `serializer_class`: a 400 with field messages when it does not validate."""
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def require_project_perm(user, project_id: int, perm: str, message: str) -> None:
    """403 unless `user`'s role on a project they can see allows `perm` (or an operator holds it globally).

    Not a second scope check: the object was found through the scoped queryset; this is what the role allows.
    """
    if not roles.projects_for(user, perm).filter(pk=project_id).exists():
        raise exceptions.PermissionDenied(message)


CONFLICT = OpenApiResponse(
    request_serializers.ConflictSerializer, description="Illegal state change or capacity short."
)


# --- Projects and members ------------------------------------------------------------------------

USER_ID = OpenApiParameter("user_id", int, OpenApiParameter.PATH, description="The member's user id.")


@extend_schema_view(
    list=extend_schema(summary="My projects, with my role in each"),
    retrieve=extend_schema(summary="One of my projects"),
)
class ProjectViewSet(ProjectScopedQuerysetMixin, viewsets.ReadOnlyModelViewSet):
    queryset = Project.objects.all()
    serializer_class = serializers.ProjectSerializer
    filterset_class = filters.ProjectFilter
    ordering_fields = ["slug", "name", "created_at"]
    project_lookup = "self"

    def get_queryset(self):
        return roles.annotate_roles(super().get_queryset(), self.request.user).order_by("slug")

    @extend_schema(summary="Members of a project and their roles", responses=serializers.MemberSerializer(many=True))
    @action(detail=True, methods=["get"], url_path="members", pagination_class=None, filterset_class=None)
    def members(self, request, pk=None):
        project = self.get_object()
        rows = [{"user": u.pk, "username": u.username, "role": role} for u, role in roles.members(project)]
        return Response(serializers.MemberSerializer(rows, many=True).data)

    @extend_schema(
        summary="Add a member (project admins)",
        request=serializers.MemberSerializer,
        responses={201: serializers.MemberSerializer},
    )
    @members.mapping.post
    def add_member(self, request, pk=None):
        project = self._manageable_project()
        serializer = serializers.MemberSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = serializer.context["member"]
        if roles.role_of(project, user) is not None:
            raise Conflict(f"{user.username} is already a member; change their role instead.")
        roles.set_role(project, user, serializer.validated_data["role"])
        return Response(
            {"user": user.pk, "username": user.username, "role": serializer.validated_data["role"]},
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(
        summary="Change a member's role (project admins)",
        parameters=[USER_ID],
        request=serializers.RoleSerializer,
        responses={200: serializers.MemberSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["patch"], url_path=r"members/(?P<user_id>\d+)", filterset_class=None)
    def member(self, request, pk=None, user_id=None):
        project = self._manageable_project()
        user = self._member(project, user_id)
        serializer = serializers.RoleSerializer(data=request.data, partial=True)  # PATCH: no role, no change
        serializer.is_valid(raise_exception=True)
        role = serializer.validated_data.get("role", roles.role_of(project, user))
        with transaction.atomic():
            self._keep_an_admin(project, user, role)
            roles.set_role(project, user, role)
        return Response({"user": user.pk, "username": user.username, "role": role})

    @extend_schema(
        summary="Remove a member (project admins)", parameters=[USER_ID], responses={204: None, 409: CONFLICT}
    )
    @member.mapping.delete
    def remove_member(self, request, pk=None, user_id=None):
        project = self._manageable_project()
        user = self._member(project, user_id)
        with transaction.atomic():
            self._keep_an_admin(project, user, None)
            roles.set_role(project, user, None)
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _manageable_project(self) -> Project:
        project = self.get_object()
        require_project_perm(self.request.user, project.pk, "manage_members", "Only project admins manage members.")
        return project

    def _member(self, project: Project, user_id):
        user = get_object_or_404(get_user_model(), pk=user_id)
        if roles.role_of(project, user) is None:
            raise exceptions.NotFound("No such member.")
        return user

    def _keep_an_admin(self, project: Project, user, role) -> None:
        if roles.role_of(project, user) == "admin" and role != "admin" and not roles.admins_left(project, without=user):
            raise Conflict("A project keeps at least one admin: make someone else admin first.")


# --- Pools and allocations -----------------------------------------------------------------------


@extend_schema_view(
    list=extend_schema(summary="GPU pools of my projects, with their cards"),
    retrieve=extend_schema(summary="One GPU pool and its card"),
)
class GpuPoolViewSet(ProjectScopedQuerysetMixin, viewsets.ReadOnlyModelViewSet):
    queryset = GpuPool.objects.select_related("project", "cluster", "request")
    serializer_class = serializers.GpuPoolSerializer
    filterset_class = filters.GpuPoolFilter
    ordering_fields = ["created_at", "id", "name", "state"]
    operator_perms = {"retry": ("pools.change_gpupool",), "share_priority": ("pools.change_gpupool",)}

    def get_queryset(self):
        return super().get_queryset().with_card().with_clusters().with_shares()

    @extend_schema(
        summary="Set a time-sliced or MPS pool's share priority (operators): lower priorities are evicted first "
        "when a shared GPU is over-subscribed",
        request=serializers.SharePrioritySerializer,
        responses={200: serializers.GpuPoolSerializer},
    )
    @action(detail=True, methods=["post"], url_path="share-priority", filterset_class=None, scope=Scope.OPERATOR)
    def share_priority(self, request, pk=None):
        pool = self.get_object()
        body = serializers.SharePrioritySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            services.set_share_priority(pool, body.validated_data["share_priority"], actor=request.user)
        except ValueError as exc:
            raise exceptions.ValidationError({"share_priority": [str(exc)]}) from None
        return Response(self.get_serializer(self.get_queryset().get(pk=pool.pk)).data)

    @extend_schema(
        summary="Retry provisioning of a failed pool (operators)",
        request=None,
        responses={200: serializers.GpuPoolSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None, scope=Scope.OPERATOR)
    def retry(self, request, pk=None):
        pool = self.get_object()
        reject_body(request)
        services.retry_provisioning(pool, actor=request.user)
        return Response(self.get_serializer(self.get_queryset().get(pk=pool.pk)).data)

    @extend_schema(
        summary="Opt the pool in or out of lending its idle units (project admins, operators); "
        "opting out takes lent units back after the grace period",
        request=serializers.LendingSerializer,
        responses={200: serializers.GpuPoolSerializer},
    )
    @action(detail=True, methods=["post"], filterset_class=None)
    def lending(self, request, pk=None):
        pool = self.get_object()
        require_project_perm(request.user, pool.project_id, "change_project", "Only project admins set lending.")
        body = serializers.LendingSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        lending.set_lending(pool, body.validated_data["lending_enabled"])
        return Response(self.get_serializer(self.get_queryset().get(pk=pool.pk)).data)

    @extend_schema(
        summary="Take the pool's lent units back (project admins and members): the borrowers' pods are "
        "evicted after the grace period",
        request=None,
        responses={200: serializers.GpuPoolSerializer},
    )
    @action(detail=True, methods=["post"], filterset_class=None)
    def reclaim(self, request, pk=None):
        pool = self.get_object()
        reject_body(request)
        require_project_perm(request.user, pool.project_id, "request_capacity", "Your role does not allow this.")
        lending.reclaim_pool(pool)
        return Response(self.get_serializer(self.get_queryset().get(pk=pool.pk)).data)


@extend_schema_view(
    list=extend_schema(summary="My projects' best-effort requests (preemptible units from idle reservations)"),
    retrieve=extend_schema(summary="One best-effort request"),
    create=extend_schema(summary="Ask for best-effort units of a spec (project members)"),
)
class BestEffortRequestViewSet(
    ProjectScopedQuerysetMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Best-effort borrowing without a queued request (docs/queue.md, Borrowing): members ask and end;
    the lending beat serves open requests from other projects' idle units after the queue."""

    queryset = (
        BestEffortRequest.objects.select_related("project", "cluster", "requested_by")
        .with_units_held()
        .order_by("-created_at", "-id")
    )
    serializer_class = serializers.BestEffortRequestSerializer
    filterset_class = filters.BestEffortRequestFilter
    ordering_fields = ["created_at", "id"]

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        created = serializer.save()
        return Response(
            self.get_serializer(self.get_queryset().get(pk=created.pk)).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(
        summary="End a best-effort request (project members): its lent units go back to their lenders now",
        request=request_serializers.ReasonSerializer,
        responses={200: serializers.BestEffortRequestSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None)
    def end(self, request, pk=None):
        obj = self.get_object()
        require_project_perm(request.user, obj.project_id, "request_capacity", "Your role does not allow this.")
        reason = validated_body(request)["reason"] or f"ended by {request.user.get_username()}"
        if not lending.end_best_effort(obj, reason=reason):
            raise Conflict(f"Best-effort request #{obj.pk} has ended already.")
        return Response(self.get_serializer(self.get_queryset().get(pk=obj.pk)).data)


@extend_schema_view(
    list=extend_schema(summary="Units allocated to my projects' pools"),
    retrieve=extend_schema(summary="One allocated unit"),
)
class AllocationViewSet(ProjectScopedQuerysetMixin, viewsets.ReadOnlyModelViewSet):
    queryset = Allocation.objects.select_related("project", "pool", "gpu__node__cluster", "mig_instance")
    serializer_class = serializers.AllocationSerializer
    filterset_class = filters.AllocationFilter
    ordering_fields = ["allocated_at", "id", "pool"]


# --- API tokens ----------------------------------------------------------------------------------


@extend_schema_view(
    list=extend_schema(summary="My API tokens (never their keys)"),
    retrieve=extend_schema(summary="One of my API tokens"),
    create=extend_schema(
        summary="Create an API token: the key is in this response only",
        responses={201: serializers.NewApiTokenSerializer},
    ),
    destroy=extend_schema(summary="Revoke one of my API tokens"),
)
class ApiTokenViewSet(
    OwnUserQuerysetMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Personal tokens: `Authorization: Bearer <key>`. Stored as SHA-256 digests; revoking keeps the row."""

    queryset = ApiToken.objects.all()
    serializer_class = serializers.ApiTokenSerializer
    filterset_class = None
    ordering_fields = ["created_at", "id"]

    def get_queryset(self):
        return super().get_queryset().order_by("-created_at", "-id")

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        token = serializer.save()
        return Response(serializers.NewApiTokenSerializer(token).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: ApiToken) -> None:
        tenancy_services.revoke_token(instance)

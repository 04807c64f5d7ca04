"""Operator API for drain-and-move: start one, follow it with its trail, give the node back, resume.

Operators only (staff holding capacity's NodeDrain model permissions): it moves every project's
reservations, so anyone else gets 403. Bad input is 400 with field messages; a refusal (the free reserve
cannot absorb the node's reservations: the shortfall is in the answer) or an illegal change is 409.
"""

from __future__ import annotations

from django_filters import rest_framework as filters
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from capacity.api.strict import StrictSerializer, reject_body
from capacity.models import NodeCapacity, NodeDrain, NodeDrainStep
from core.scopes import Scope
from operations import maintenance
from operations.reconfiguration import Refused


class DrainConflictSerializer(serializers.Serializer):
    detail = serializers.CharField()
    shortfall = serializers.DictField(child=serializers.IntegerField(), required=False)


CONFLICT = OpenApiResponse(DrainConflictSerializer, description="Refused (with the shortfall), or illegal now.")


class NodeDrainStepSerializer(serializers.ModelSerializer):
    class Meta:
        model = NodeDrainStep
        fields = ["id", "step", "event", "message", "detail", "task_id", "actor", "at"]


class NodeDrainSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)
    phase = serializers.CharField(read_only=True, help_text='"in maintenance" while handed over, else step/state.')
    steps = NodeDrainStepSerializer(many=True, read_only=True)

    class Meta:
        model = NodeDrain
        fields = [
            "id",
            "cluster",
            "node",
            "node_name",
            "reason",
            "grace_s",
            "driver_upgrade",
            "evict_after",
            "step",
            "state",
            "phase",
            "moves",
            "attempts",
            "was_cordoned",
            "give_back_at",
            *NodeDrain.STEP_TIMESTAMPS.values(),
            "finished_at",
            "failed_step",
            "error",
            "task_id",
            "created_by",
            "created_at",
            "steps",
        ]
        read_only_fields = fields


class StartDrainSerializer(StrictSerializer):
    node = serializers.PrimaryKeyRelatedField(queryset=NodeCapacity.objects.present())
    reason = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")
    grace_s = serializers.IntegerField(
        required=False, min_value=0, max_value=7 * 86400, help_text="Notice before pods are evicted (default setting)."
    )
    driver_upgrade = serializers.BooleanField(
        default=False, help_text="Hand the node to the GPU Operator's driver upgrade controller at handover."
    )


class NodeDrainFilter(filters.FilterSet):
    class Meta:
        model = NodeDrain
        fields = ["cluster", "node", "state", "step"]


@extend_schema_view(
    list=extend_schema(summary="Drains (maintenance), newest first"),
    retrieve=extend_schema(summary="One drain with its moves and audit trail"),
)
class NodeDrainViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    queryset = NodeDrain.objects.select_related("node").prefetch_related("steps").order_by("-created_at", "-id")
    serializer_class = NodeDrainSerializer
    scope = Scope.OPERATOR
    operator_perms = {
        "give_back": ("capacity.change_nodedrain",),
        "resume": ("capacity.change_nodedrain",),
    }
    filterset_class = NodeDrainFilter
    ordering_fields = ["id", "created_at", "state"]

    @extend_schema(
        summary="Take a node offline: move its reservations, evict after the grace, hand it over",
        request=StartDrainSerializer,
        responses={201: NodeDrainSerializer, 409: CONFLICT},
    )
    def create(self, request, *args, **kwargs):
        form = StartDrainSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        try:
            drain = maintenance.start(
                data["node"],
                reason=data["reason"],
                grace_s=data.get("grace_s"),
                driver_upgrade=data["driver_upgrade"],
                actor=request.user,
            )
        except Refused as exc:
            return Response(
                {"detail": str(exc), "shortfall": exc.detail.get("shortfall", {})}, status=status.HTTP_409_CONFLICT
            )
        return Response(self.get_serializer(drain).data, status=status.HTTP_201_CREATED)

    def _transition(self, service):
        drain = self.get_object()
        reject_body(self.request)
        result = service(drain, actor=self.request.user)
        return Response(self.get_serializer(result).data)

    @extend_schema(
        summary="Give a handed-over node back: uncordoned once Ready with every GPU healthy",
        request=None,
        responses={200: NodeDrainSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], url_path="give-back")
    def give_back(self, request, pk=None):
        return self._transition(maintenance.give_back)

    @extend_schema(
        summary="Resume a failed drain at its failed step",
        request=None,
        responses={200: NodeDrainSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        return self._transition(maintenance.resume)

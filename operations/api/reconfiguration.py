"""Operator API for MIG reconfigurations: create, list with the audit trail, resume, roll back, cancel.

Operators only (staff holding each action's model permission; force needs
capacity.force_migreconfiguration): these act on shared hardware, so anyone else gets 403. Bad
input is 400 with field messages; a refused or illegal state change (allocated GPUs without drain,
outside a maintenance window without force, resume of a reconfiguration that has not failed, a
second open reconfiguration of a node) is 409.
"""

from __future__ import annotations

import re

from django_filters import rest_framework as filters
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field, extend_schema_view
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from capacity.api.strict import StrictSerializer, reject_body
from capacity.choices import ReconfigurationBackend
from capacity.models import FORCE_PERMISSION, MigLayout, MigReconfiguration, MigReconfigurationStep, NodeCapacity
from core.api import Conflict
from core.scopes import Scope
from operations import reconfiguration as rc
from tenancy.roles import operator_can


class ReconfigurationConflictSerializer(serializers.Serializer):
    detail = serializers.CharField()


CONFLICT = OpenApiResponse(ReconfigurationConflictSerializer, description="Refused, or illegal in the current state.")


class MigReconfigurationStepSerializer(serializers.ModelSerializer):
    class Meta:
        model = MigReconfigurationStep
        fields = ["id", "step", "event", "message", "detail", "task_id", "actor", "at"]


class MigReconfigurationSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)
    steps = MigReconfigurationStepSerializer(many=True, read_only=True)

    class Meta:
        model = MigReconfiguration
        fields = [
            "id",
            "cluster",
            "node",
            "node_name",
            "layout",
            "source",
            "target",
            "plan",
            "previous",
            "config_name",
            "backend",
            "drain",
            "force",
            "step",
            "state",
            "attempts",
            "was_cordoned",
            *MigReconfiguration.STEP_TIMESTAMPS.values(),
            "finished_at",
            "failed_step",
            "error",
            "task_id",
            "rollback_of",
            "created_by",
            "created_at",
            "steps",
        ]
        read_only_fields = fields


GPU_INDEX = re.compile(r"0|[1-9][0-9]{0,3}")


def _placement_error(entry) -> str | None:
    """What is wrong with one per_gpu entry: a profile name, or {"profile": name, "start": slice}."""
    if isinstance(entry, str):
        return None if entry else "a profile name cannot be empty"
    if not isinstance(entry, dict):
        return 'give a profile name or {"profile": name, "start": slice}'
    if set(entry) != {"profile", "start"}:
        return 'give exactly "profile" and "start"'
    if not isinstance(entry["profile"], str) or not entry["profile"]:
        return '"profile" must be a profile name'
    if not isinstance(entry["start"], int) or isinstance(entry["start"], bool) or entry["start"] < 0:
        return '"start" must be a memory slice index (0, 1, ...)'
    return None


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": {
            "nullable": True,
            "type": "array",
            "items": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {
                        "type": "object",
                        "properties": {
                            "profile": {"type": "string", "minLength": 1},
                            "start": {"type": "integer", "minimum": 0},
                        },
                        "required": ["profile", "start"],
                        "additionalProperties": False,
                    },
                ]
            },
        },
    }
)
class PerGpuField(serializers.DictField):
    """GPU index -> a list of profile names or {"profile", "start"} placements, or null (MIG off)."""


class ReconfigureSerializer(StrictSerializer):
    """Exactly one of layout, named, per_gpu."""

    node = serializers.PrimaryKeyRelatedField(queryset=NodeCapacity.objects.present())
    layout = serializers.PrimaryKeyRelatedField(queryset=MigLayout.objects.all(), required=False, allow_null=True)
    named = serializers.CharField(required=False, allow_blank=True, help_text="A GPU Operator named config.")
    per_gpu = PerGpuField(
        child=serializers.JSONField(allow_null=True),
        required=False,
        help_text='{"0": ["4g.40gb", "3g.40gb"], "1": null}; GPUs not named stay as they are.',
    )
    backend = serializers.ChoiceField(choices=ReconfigurationBackend.choices, default=ReconfigurationBackend.OPERATOR)
    drain = serializers.BooleanField(default=False)
    force = serializers.BooleanField(default=False)

    def validate_per_gpu(self, value):
        errors = []
        for key, profiles in value.items():
            if not GPU_INDEX.fullmatch(str(key)):
                errors.append(f"{key!r} is not a GPU index (0, 1, 2, ...)")
            elif profiles is not None and not isinstance(profiles, list):
                errors.append(f"GPU {key}: give a list of profiles or null")
            elif profiles is not None:
                errors += [f"GPU {key}, entry {n}: {e}" for n, p in enumerate(profiles) if (e := _placement_error(p))]
        if errors:
            raise serializers.ValidationError(errors)
        return value

    def validate(self, attrs):
        try:
            attrs["source"], attrs["target"] = rc.target_from(
                attrs["node"],
                layout=attrs.get("layout"),
                named=attrs.get("named") or "",
                per_gpu=attrs.get("per_gpu") or None,
            )
        except ValueError as exc:
            raise serializers.ValidationError({"non_field_errors": [str(exc)]}) from None
        try:
            rc.plan_node(attrs["node"], attrs["target"], attrs["backend"])
        except rc.ReconfigurationError as exc:
            raise serializers.ValidationError({"non_field_errors": [str(exc)]}) from None
        return attrs


class MigReconfigurationFilter(filters.FilterSet):
    class Meta:
        model = MigReconfiguration
        fields = ["cluster", "node", "state", "step", "backend"]


@extend_schema_view(
    list=extend_schema(summary="MIG reconfigurations, newest first"),
    retrieve=extend_schema(summary="One reconfiguration with its audit trail"),
)
class MigReconfigurationViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    queryset = (
        MigReconfiguration.objects.select_related("node").prefetch_related("steps").order_by("-created_at", "-id")
    )
    serializer_class = MigReconfigurationSerializer
    scope = Scope.OPERATOR
    operator_perms = {
        "resume": ("capacity.change_migreconfiguration",),
        "rollback": ("capacity.change_migreconfiguration",),
        "cancel": ("capacity.change_migreconfiguration",),
    }
    filterset_class = MigReconfigurationFilter
    ordering_fields = ["id", "created_at", "state"]

    @extend_schema(
        summary="Reconfigure a node's MIG layout (queued after commit)",
        request=ReconfigureSerializer,
        responses={201: MigReconfigurationSerializer, 409: CONFLICT},
    )
    def create(self, request, *args, **kwargs):
        form = ReconfigureSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        if data["force"] and not operator_can(request.user, FORCE_PERMISSION):
            raise exceptions.PermissionDenied(f"Forcing a reconfiguration needs the {FORCE_PERMISSION} permission.")
        try:
            reconf = rc.create_from(data, actor=request.user)
        except rc.Refused as exc:
            raise Conflict(str(exc)) from None
        except rc.ReconfigurationError as exc:
            raise serializers.ValidationError({"non_field_errors": [str(exc)]}) from None
        return Response(self.get_serializer(reconf).data, status=status.HTTP_201_CREATED)

    def _transition(self, service):
        reconf = self.get_object()
        reject_body(self.request)
        result = service(reconf, actor=self.request.user)
        return Response(self.get_serializer(result).data)

    @extend_schema(
        summary="Resume a failed reconfiguration at its failed step",
        request=None,
        responses={200: MigReconfigurationSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        return self._transition(rc.resume)

    @extend_schema(
        summary="Roll a failed reconfiguration back to the layout before (returns the new reconfiguration)",
        request=None,
        responses={200: MigReconfigurationSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"])
    def rollback(self, request, pk=None):
        return self._transition(rc.rollback)

    @extend_schema(
        summary="Cancel a reconfiguration that has not touched the node",
        request=None,
        responses={200: MigReconfigurationSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        return self._transition(rc.cancel)

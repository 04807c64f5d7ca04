"""Operator API for rolling driver upgrades: create one, follow its waves and nodes, pause, resume, cancel,
and (own_drain mode) give a node back once upgraded.

Operators only (staff holding the operations app's DriverUpgrade model permissions), like /api/v1/node-drains/:
a rollout moves every project's reservations, so anyone else gets 403. Bad input is 400 with field messages
and writes nothing; a change the rollout's state does not allow is 409.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError as FormValidationError
from django.db.models import Prefetch
from django_filters import rest_framework as filters
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from capacity.api.strict import StrictSerializer, reject_body
from capacity.models import Cluster, NodeCapacity
from core.scopes import Scope
from operations.choices import UpgradeMode
from operations.maintenance import rollout
from operations.models import DriverUpgrade, DriverUpgradeNode

CONFLICT = OpenApiResponse(description="Illegal in the rollout's current state, or the node is not handed over.")


class DriverUpgradeNodeSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)

    class Meta:
        model = DriverUpgradeNode
        fields = [
            "node",
            "node_name",
            "position",
            "wave",
            "state",
            "drain",
            "draining_at",
            "upgrading_at",
            "done_at",
            "failed_at",
            "error",
        ]
        read_only_fields = fields


class DriverUpgradeSerializer(serializers.ModelSerializer):
    nodes_total = serializers.IntegerField(read_only=True)
    nodes_done = serializers.IntegerField(read_only=True)
    failed_nodes = serializers.IntegerField(source="nodes_failed", read_only=True)
    nodes_in_flight = serializers.IntegerField(read_only=True)
    nodes = DriverUpgradeNodeSerializer(many=True, read_only=True)

    class Meta:
        model = DriverUpgrade
        fields = [
            "id",
            *DriverUpgrade.SETTINGS_FIELDS,
            "state",
            "current_wave",
            "waiting_for",
            "next_window_at",
            "nodes_total",
            "nodes_done",
            "failed_nodes",
            "nodes_in_flight",
            "started_at",
            "finished_at",
            "error",
            "created_by",
            "created_at",
            "nodes",
        ]
        read_only_fields = fields


class CreateDriverUpgradeSerializer(StrictSerializer):
    cluster = serializers.PrimaryKeyRelatedField(queryset=Cluster.objects.all())
    nodes = serializers.PrimaryKeyRelatedField(
        queryset=NodeCapacity.objects.present(),
        many=True,
        required=False,
        help_text="Upgrade these nodes (of the cluster); default: the node group's, else every GPU node.",
    )
    node_group = serializers.CharField(required=False, allow_blank=True, max_length=100, default="")
    name = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")
    mode = serializers.ChoiceField(
        choices=UpgradeMode.choices, required=False, help_text="Default: controller when autoUpgrade is on."
    )
    max_parallel = serializers.IntegerField(
        required=False, min_value=1, max_value=10_000, help_text="Default: ClusterPolicy maxParallelUpgrades."
    )
    grace_s = serializers.IntegerField(
        required=False, min_value=0, max_value=7 * 86400, help_text="Notice before pods are evicted (default setting)."
    )

    def validate(self, data):
        cluster = data["cluster"]
        strangers = sorted(n.name for n in data.get("nodes") or () if n.cluster_id != cluster.pk)
        if strangers:
            raise serializers.ValidationError({"nodes": f"not nodes of {cluster}: {', '.join(strangers)}"})
        return data


class GiveBackSerializer(StrictSerializer):
    node = serializers.PrimaryKeyRelatedField(queryset=NodeCapacity.objects.present())
    note = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")


class DriverUpgradeFilter(filters.FilterSet):
    class Meta:
        model = DriverUpgrade
        fields = ["cluster", "state", "mode"]


@extend_schema_view(
    list=extend_schema(summary="Rolling driver upgrades, newest first, with their progress"),
    retrieve=extend_schema(summary="One rolling driver upgrade with each node's progress"),
)
class DriverUpgradeViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    queryset = (
        DriverUpgrade.objects.with_progress()
        .prefetch_related(Prefetch("nodes", DriverUpgradeNode.objects.select_related("node").order_by("position")))
        .order_by("-created_at", "-id")
    )
    serializer_class = DriverUpgradeSerializer
    scope = Scope.OPERATOR
    operator_perms = {
        "pause": ("operations.change_driverupgrade",),
        "resume": ("operations.change_driverupgrade",),
        "cancel": ("operations.change_driverupgrade",),
        "give_back": ("operations.change_driverupgrade", "capacity.change_nodedrain"),
    }
    filterset_class = DriverUpgradeFilter
    ordering_fields = ["id", "created_at", "state"]

    def _fresh(self, pk: int):
        return self.get_serializer(self.get_queryset().get(pk=pk)).data

    @extend_schema(
        summary="Start a rolling driver/firmware upgrade: waves inside maintenance windows, reservations kept",
        request=CreateDriverUpgradeSerializer,
        responses={201: DriverUpgradeSerializer},
    )
    def create(self, request, *args, **kwargs):
        form = CreateDriverUpgradeSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        try:
            upgrade = rollout.create(
                data["cluster"],
                nodes=data.get("nodes") or None,
                node_group=data["node_group"],
                name=data["name"],
                mode=data.get("mode"),
                max_parallel=data.get("max_parallel"),
                grace_s=data.get("grace_s"),
                actor=request.user,
            )
        except FormValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from None
        return Response(self._fresh(upgrade.pk), status=status.HTTP_201_CREATED)

    def _transition(self, service):
        upgrade = self.get_object()
        reject_body(self.request)
        service(upgrade, actor=self.request.user)
        return Response(self._fresh(upgrade.pk))

    @extend_schema(
        summary="Pause: no new wave starts", request=None, responses={200: DriverUpgradeSerializer, 409: CONFLICT}
    )
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        return self._transition(rollout.pause)

    @extend_schema(
        summary="Resume a paused rollout", request=None, responses={200: DriverUpgradeSerializer, 409: CONFLICT}
    )
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        return self._transition(rollout.resume)

    @extend_schema(
        summary="Cancel: nodes not started stay as they are; nodes out are followed until back",
        request=None,
        responses={200: DriverUpgradeSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        return self._transition(rollout.cancel)

    @extend_schema(
        summary="own_drain mode: the node is upgraded, give it back (uncordoned once healthy)",
        request=GiveBackSerializer,
        responses={200: DriverUpgradeSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], url_path="give-back")
    def give_back(self, request, pk=None):
        upgrade = self.get_object()
        form = GiveBackSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        rollout.give_back_node(
            upgrade, form.validated_data["node"], actor=request.user, note=form.validated_data["note"]
        )
        return Response(self._fresh(upgrade.pk))

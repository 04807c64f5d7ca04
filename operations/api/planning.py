"""Operator API for planning maintenance: the take-offline check and the rebalancing proposal. Read-only.

Operators only: take-offline needs capacity.view_nodecapacity and pools.view_allocation (it lists
every project's allocations on the units going down), rebalancing capacity.view_migreconfiguration.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from capacity.api.fields import CatalogProductField
from capacity.api.strict import StrictSerializer
from capacity.mig.catalog import get_product
from capacity.models import Cluster, GpuCapacity, NodeCapacity
from core.api import QuerySerializer
from core.scopes import Scope
from operations import maintenance, rebalancing


class TakeOfflineRequest(StrictSerializer):
    nodes = serializers.PrimaryKeyRelatedField(queryset=NodeCapacity.objects.present(), many=True, required=False)
    gpus = serializers.PrimaryKeyRelatedField(queryset=GpuCapacity.objects.present(), many=True, required=False)

    def validate(self, attrs):
        if not attrs.get("nodes") and not attrs.get("gpus"):
            raise serializers.ValidationError({"non_field_errors": ["Give nodes or gpus."]})
        return attrs


class OfflineHitSerializer(serializers.Serializer):
    allocation = serializers.IntegerField()
    project = serializers.CharField()
    pool = serializers.IntegerField()
    node = serializers.CharField()
    gpu = serializers.IntegerField()
    unit = serializers.CharField()
    movable = serializers.BooleanField()


class OfflineGpuSerializer(serializers.Serializer):
    node = serializers.CharField()
    index = serializers.IntegerField()
    uuid = serializers.CharField()


class TakeOfflineSerializer(serializers.Serializer):
    covered = serializers.BooleanField(help_text="Every allocation hit can move to a free equivalent unit.")
    gpus = OfflineGpuSerializer(many=True)
    hit = OfflineHitSerializer(many=True)
    free_elsewhere = serializers.DictField(child=serializers.IntegerField())
    shortfall = serializers.DictField(child=serializers.IntegerField())


class TakeOfflineView(APIView):
    """Would the remaining capacity cover every allocation if these GPUs or nodes went down?"""

    scope = Scope.OPERATOR
    operator_perms = {"post": ("capacity.view_nodecapacity", "pools.view_allocation")}

    @extend_schema(summary="Take-offline check", request=TakeOfflineRequest, responses=TakeOfflineSerializer)
    def post(self, request):
        form = TakeOfflineRequest(data=request.data)
        form.is_valid(raise_exception=True)
        check = maintenance.take_offline_check(
            gpus=form.validated_data.get("gpus", []), nodes=form.validated_data.get("nodes", [])
        )
        return Response(check.to_dict())


class RebalanceQuery(QuerySerializer):
    cluster = serializers.PrimaryKeyRelatedField(queryset=Cluster.objects.all())
    product = CatalogProductField()
    days = serializers.IntegerField(min_value=1, max_value=365, default=30)

    def validate_product(self, value):
        try:
            return get_product(value).key
        except KeyError as exc:
            raise serializers.ValidationError(exc.args[0]) from None


class RebalanceSerializer(serializers.Serializer):
    cluster = serializers.CharField()
    product = serializers.CharField()
    days = serializers.IntegerField()
    requested = serializers.DictField(child=serializers.IntegerField())
    used = serializers.DictField(child=serializers.IntegerField())
    demand = serializers.DictField(child=serializers.IntegerField())
    met = serializers.DictField(child=serializers.IntegerField())
    unmet = serializers.DictField(child=serializers.IntegerField())
    touched = serializers.IntegerField()
    exact = serializers.BooleanField()
    slots_before = serializers.DictField(child=serializers.IntegerField())
    slots_after = serializers.DictField(child=serializers.IntegerField())
    gained = serializers.DictField(child=serializers.IntegerField())
    lost = serializers.DictField(child=serializers.IntegerField())
    targets = serializers.DictField(child=serializers.DictField(), help_text="node -> {gpu index: placements}")
    next_windows = serializers.DictField(child=serializers.DictField(allow_null=True))
    rows = serializers.ListField(child=serializers.DictField())


class RebalanceView(APIView):
    """The layout to apply in the next maintenance window, from the last period's demand."""

    scope = Scope.OPERATOR
    operator_perms = {"get": ("capacity.view_migreconfiguration",)}

    @extend_schema(
        summary="Rebalancing proposal",
        parameters=[RebalanceQuery],  # its fields' own bounds (days 1 to 365, a catalog product)
        responses=RebalanceSerializer,
    )
    def get(self, request):
        query = RebalanceQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        proposal = rebalancing.propose_rebalance(data["cluster"], data["product"], days=data["days"])
        return Response(proposal.to_dict())

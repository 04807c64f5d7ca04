"""Operator API for capacity's MIG and time-slicing settings: layouts, maintenance windows,
time-slicing policies, and the capacity plan (effective slots per tier, now and proposed).

Operators only (staff holding each action's model permission): these act on shared hardware, so
anyone else gets 403. Bad input is 400 with field messages. Reconfiguring a node, the take-offline
check and rebalancing span capacity and pools: operations/api.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import transaction
from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from capacity.api.fields import CatalogProductField, WallClockTimeField
from capacity.api.strict import StrictModelSerializer, reject_body
from capacity.choices import Tier
from capacity.models import SHARING_POLICY_FIELDS, Cluster, MaintenanceWindow, MigLayout, TimeSlicingPolicy
from capacity.services import mig_configs, planning
from core.api import QuerySerializer
from core.scopes import Scope


def _model_errors(instance) -> None:
    """Run the model's clean() and turn its ValidationError into a DRF 400 with field messages."""
    try:
        instance.clean()
    except ValidationError as exc:
        raise serializers.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages) from None


# --- Layouts ------------------------------------------------------------------------------------


class MigLayoutSerializer(StrictModelSerializer):
    config_name = serializers.CharField(read_only=True)
    product = CatalogProductField(max_length=MigLayout._meta.get_field("product").max_length)
    gpus = serializers.JSONField(
        help_text='{"all": ["3g.40gb", "3g.40gb"]} or {"0": ["7g.80gb"], "1": null}; null = MIG off.'
    )

    class Meta:
        model = MigLayout
        fields = ["id", "name", "product", "gpus", "description", "config_name", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]

    def validate(self, attrs):
        instance = MigLayout(**{**({} if self.instance is None else _fields(self.instance)), **attrs})
        _model_errors(instance)
        attrs["product"] = instance.product
        return attrs


def _fields(instance: MigLayout) -> dict:
    return {"name": instance.name, "product": instance.product, "gpus": instance.gpus, "pk": instance.pk}


class MigLayoutFilter(filters.FilterSet):
    class Meta:
        model = MigLayout
        fields = ["product", "name"]


@extend_schema_view(
    list=extend_schema(summary="Custom MIG layouts"),
    create=extend_schema(summary="Add a custom MIG layout (written to gpuaas's mig-parted ConfigMap)"),
)
class MigLayoutViewSet(viewsets.ModelViewSet):
    queryset = MigLayout.objects.order_by("product", "name")
    serializer_class = MigLayoutSerializer
    scope = Scope.OPERATOR
    filterset_class = MigLayoutFilter
    ordering_fields = ["name", "product", "updated_at"]

    def perform_create(self, serializer):
        with transaction.atomic():
            serializer.save()
            mig_configs.publish()

    def perform_update(self, serializer):
        with transaction.atomic():
            serializer.save()
            mig_configs.publish()

    def perform_destroy(self, instance):
        with transaction.atomic():
            instance.delete()
            mig_configs.publish()


# --- Maintenance windows and time-slicing --------------------------------------------------------


class MaintenanceWindowSerializer(StrictModelSerializer):
    open_now = serializers.SerializerMethodField()
    start_time = WallClockTimeField(required=False, allow_null=True, help_text="Weekly: opens at (UTC).")
    end_time = WallClockTimeField(
        required=False, allow_null=True, help_text="Weekly: closes at (UTC); before start = next day."
    )

    class Meta:
        model = MaintenanceWindow
        fields = [
            "id",
            "cluster",
            "node_group",
            "name",
            "weekday",
            "start_time",
            "end_time",
            "starts_at",
            "ends_at",
            "enabled",
            "open_now",
        ]

    def get_open_now(self, obj) -> bool:
        return obj.is_open()

    def validate(self, attrs):
        current = {} if self.instance is None else {f: getattr(self.instance, f) for f in self.Meta.fields[1:-1]}
        _model_errors(MaintenanceWindow(**{**current, **attrs}))
        return attrs


class MaintenanceWindowFilter(filters.FilterSet):
    class Meta:
        model = MaintenanceWindow
        fields = ["cluster", "node_group", "enabled"]


class MaintenanceWindowViewSet(viewsets.ModelViewSet):
    queryset = MaintenanceWindow.objects.select_related("cluster").order_by("cluster_id", "node_group", "id")
    serializer_class = MaintenanceWindowSerializer
    scope = Scope.OPERATOR
    filterset_class = MaintenanceWindowFilter
    ordering_fields = ["id", "cluster", "node_group"]


class TimeSlicingPolicySerializer(StrictModelSerializer):
    """A sharing policy: time-slicing or MPS. Bad values are 400 with field messages (the model's clean())."""

    config_key = serializers.CharField(read_only=True)
    memory_isolation = serializers.SerializerMethodField(
        help_text="Always false: time-slicing shares memory; MPS caps it per client but clients share faults."
    )
    client_environment = serializers.DictField(
        child=serializers.CharField(),
        read_only=True,
        help_text="MPS: the CUDA MPS client variables the project's pool ConfigMap carries for this policy's limits.",
    )

    class Meta:
        model = TimeSlicingPolicy
        fields = [
            "id",
            *SHARING_POLICY_FIELDS,
            "config_key",
            "memory_isolation",
            "client_environment",
            "applied_at",
            "nodes_labelled",
            "last_error",
        ]
        read_only_fields = ["applied_at", "nodes_labelled", "last_error"]

    def get_memory_isolation(self, obj) -> bool:
        return False

    def validate(self, attrs):
        current = {} if self.instance is None else {f: getattr(self.instance, f) for f in SHARING_POLICY_FIELDS}
        instance = TimeSlicingPolicy(**{**current, **attrs})
        _model_errors(instance)
        return attrs


class TimeSlicingPolicyFilter(filters.FilterSet):
    class Meta:
        model = TimeSlicingPolicy
        fields = ["cluster", "node_group", "strategy", "enabled"]


class TimeSlicingQueuedSerializer(serializers.Serializer):
    queued = serializers.BooleanField()


class TimeSlicingPolicyViewSet(viewsets.ModelViewSet):
    """GPU sharing per node group, time-slicing or MPS (`strategy`). Replicas are tier-3 slots; time-slicing has NO
    memory isolation between them, MPS caps each client (memory / replicas, 100 / replicas % SMs, or the
    policy's lower limits)."""

    queryset = TimeSlicingPolicy.objects.select_related("cluster").order_by("cluster_id", "node_group")
    serializer_class = TimeSlicingPolicySerializer
    scope = Scope.OPERATOR
    operator_perms = {"apply": ("capacity.change_timeslicingpolicy",)}
    filterset_class = TimeSlicingPolicyFilter
    ordering_fields = ["id", "cluster", "node_group"]

    @extend_schema(
        summary="Write the device-plugin ConfigMap key and label the group's nodes (queued)",
        request=None,
        responses={202: TimeSlicingQueuedSerializer},
    )
    @action(detail=True, methods=["post"])
    def apply(self, request, pk=None):
        policy = self.get_object()
        reject_body(request)
        with transaction.atomic():
            mig_configs.enqueue_time_slicing(policy.cluster_id)
        return Response({"queued": True}, status=status.HTTP_202_ACCEPTED)


# --- Capacity plan ---------------------------------------------------------------------------------


class SlotTierSerializer(serializers.Serializer):
    slots = serializers.IntegerField()
    by_spec = serializers.DictField(child=serializers.IntegerField())
    replicas = serializers.IntegerField(required=False)


class PlanGroupSerializer(serializers.Serializer):
    tier = serializers.ChoiceField(choices=Tier.choices, help_text="The nodes' tier (gpuaas.io/tier).")
    product = serializers.CharField()
    gpus = serializers.IntegerField()
    use = serializers.ChoiceField(choices=["mig", "timeslice", "full"])
    layout = serializers.ListField(child=serializers.CharField(), allow_null=True)
    replicas = serializers.IntegerField(allow_null=True)
    slots = serializers.IntegerField(help_text="What the layout or replicas carry, before the tier policy.")


class CurrentPlanSerializer(serializers.Serializer):
    gpus = serializers.IntegerField()
    groups = PlanGroupSerializer(many=True)


class ProposedPlanSerializer(serializers.Serializer):
    product = serializers.CharField()
    gpus = serializers.IntegerField()
    tiers = serializers.DictField(child=SlotTierSerializer())
    layout = serializers.ListField(child=serializers.DictField())


class TierSpecSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["mig", "full", "timeslice", "mps", "vgpu"])
    product = serializers.CharField()
    spec = serializers.CharField(help_text="MIG profile or vGPU type; the product for whole GPUs and replicas.")
    per_gpu = serializers.IntegerField(allow_null=True, help_text="Units one GPU gives (MIG: per layout, null).")
    gpus = serializers.IntegerField()
    total = serializers.IntegerField()
    reserved = serializers.IntegerField()
    free = serializers.IntegerField()
    unavailable = serializers.IntegerField()


class TierFiguresSerializer(serializers.Serializer):
    tier = serializers.ChoiceField(choices=Tier.choices)
    label = serializers.CharField()
    rule = serializers.CharField(help_text='The tier profile policy: "tier 1 takes 3g and larger".')
    gpus = serializers.IntegerField(help_text="Present GPUs on the tier's nodes.")
    total = serializers.IntegerField(help_text="Units approval hands out on the tier: reserved + free + unavailable.")
    reserved = serializers.IntegerField(help_text="Held by pools (active or ending allocations).")
    free = serializers.IntegerField(help_text="What approval would hand out now.")
    unavailable = serializers.IntegerField(help_text="Busy without a pool, cordoned, unhealthy, mid-reconfiguration.")
    withheld = serializers.IntegerField(help_text="MIG instances the tier's profile policy refuses (not in total).")
    unserved_gpus = serializers.IntegerField(help_text="Whole GPUs approval hands out on no tier (not in total).")
    reserve = serializers.IntegerField(help_text="Units kept free for maintenance (reserve_gpus GPUs per cluster).")
    free_after_reserve = serializers.IntegerField()
    specs = TierSpecSerializer(many=True)


class CapacityPlanSerializer(serializers.Serializer):
    reserve_gpus = serializers.IntegerField(help_text="settings.CAPACITY_MAINTENANCE_RESERVE_GPUS")
    tiers = TierFiguresSerializer(many=True, help_text="The live plan per tier: what approval would hand out.")
    current = CurrentPlanSerializer()
    proposed = ProposedPlanSerializer(allow_null=True)


class CapacityPlanQuery(QuerySerializer):
    cluster = serializers.PrimaryKeyRelatedField(queryset=Cluster.objects.all(), required=False)
    node_group = serializers.CharField(required=False)
    product = CatalogProductField(required=False)
    gpus = serializers.IntegerField(min_value=0, required=False)
    layout = serializers.CharField(required=False, help_text="Per-GPU layout, e.g. 4g.40gb,3g.40gb")
    replicas = serializers.IntegerField(min_value=2, required=False)

    def validate(self, attrs):
        if (attrs.get("layout") or attrs.get("replicas")) and not (attrs.get("product") and "gpus" in attrs):
            raise serializers.ValidationError({"product": "A proposal needs product and gpus."})
        return attrs


class CapacityPlanView(APIView):
    """The live plan per tier (what approval would hand out on each tier's nodes, and the maintenance reserve),
    the fleet's layouts, and the seed's slot arithmetic for a proposed layout or replica count. Operators only:
    a member learns what their own request would get from the dry run and the forecast."""

    scope = Scope.OPERATOR
    operator_perms = {"get": ("capacity.view_nodecapacity",)}

    @extend_schema(
        summary="Units per tier of the live fleet, its layouts, and a proposal's slots",
        parameters=[CapacityPlanQuery],  # its fields' own bounds (replicas >= 2, gpus >= 0)
        responses=CapacityPlanSerializer,
    )
    def get(self, request):
        query = CapacityPlanQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        current = planning.current_capacity_plan(cluster=data.get("cluster"), node_group=data.get("node_group"))
        live = planning.tier_plan(cluster=data.get("cluster")).as_dict()
        proposed = None
        if data.get("product") and "gpus" in data:
            try:
                proposed = planning.proposed_capacity_plan(
                    data["product"], data["gpus"], layout=data.get("layout"), timeslice_replicas=data.get("replicas")
                )
            except (ValueError, KeyError) as exc:
                raise serializers.ValidationError({"layout": [str(exc).strip('"')]}) from None
        return Response({**live, "current": current, "proposed": proposed})

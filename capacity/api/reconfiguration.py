"""Operator API for MIG: layouts, reconfigurations, maintenance windows, time-slicing, planning.

Operators only (staff holding each action's model permission; force needs
capacity.force_migreconfiguration): these act on shared hardware, so anyone else gets 403. Bad
input is 400 with field messages; a refused or illegal state change (allocated GPUs without drain,
outside a maintenance window without force, resume of a reconfiguration that has not failed, a
second open reconfiguration of a node) is 409.
"""

from __future__ import annotations

import re

from django.db import transaction
from django_filters import rest_framework as filters
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from capacity.api.strict import StrictModelSerializer, StrictSerializer, reject_body
from capacity.choices import ReconfigurationBackend
from capacity.models import (
    FORCE_PERMISSION,
    Cluster,
    GpuCapacity,
    MaintenanceWindow,
    MigLayout,
    MigReconfiguration,
    MigReconfigurationStep,
    NodeCapacity,
    TimeSlicingPolicy,
)
from capacity.services import maintenance, mig_configs, planning
from capacity.services import reconfiguration as rc
from gpuaas.api import OperatorPermissions
from tenancy.roles import operator_can


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The reconfiguration's state does not allow this."
    default_code = "conflict"


class ReconfigurationConflictSerializer(serializers.Serializer):
    detail = serializers.CharField()


CONFLICT = OpenApiResponse(ReconfigurationConflictSerializer, description="Refused, or illegal in the current state.")


def _model_errors(instance) -> None:
    """Run the model's clean() and turn its ValidationError into a DRF 400 with field messages."""
    from django.core.exceptions import ValidationError

    try:
        instance.clean()
    except ValidationError as exc:
        raise serializers.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages) from None


# --- Layouts ------------------------------------------------------------------------------------


class MigLayoutSerializer(StrictModelSerializer):
    config_name = serializers.CharField(read_only=True)
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
    permission_classes = [OperatorPermissions]
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


@extend_schema_field({"type": "string", "pattern": r"^\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?$", "example": "02:00:00"})
class WallClockTimeField(serializers.TimeField):
    """A time of day without offset ("02:00:00", UTC by convention). OpenAPI's `format: time` is
    RFC 3339's full-time, which demands an offset that DRF neither writes nor needs: so a pattern."""


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
    permission_classes = [OperatorPermissions]
    filterset_class = MaintenanceWindowFilter
    ordering_fields = ["id", "cluster", "node_group"]


class TimeSlicingPolicySerializer(StrictModelSerializer):
    config_key = serializers.CharField(read_only=True)
    memory_isolation = serializers.SerializerMethodField(help_text="Always false: time-slicing shares memory.")

    class Meta:
        model = TimeSlicingPolicy
        fields = [
            "id",
            "cluster",
            "node_group",
            "replicas",
            "rename_by_default",
            "fail_requests_greater_than_one",
            "enabled",
            "config_key",
            "memory_isolation",
            "applied_at",
            "nodes_labelled",
            "last_error",
        ]
        read_only_fields = ["applied_at", "nodes_labelled", "last_error"]

    def get_memory_isolation(self, obj) -> bool:
        return False


class TimeSlicingPolicyFilter(filters.FilterSet):
    class Meta:
        model = TimeSlicingPolicy
        fields = ["cluster", "node_group", "enabled"]


class TimeSlicingQueuedSerializer(serializers.Serializer):
    queued = serializers.BooleanField()


class TimeSlicingPolicyViewSet(viewsets.ModelViewSet):
    """Time-slicing per node group. Replicas are tier-3 slots; there is NO memory isolation between them."""

    queryset = TimeSlicingPolicy.objects.select_related("cluster").order_by("cluster_id", "node_group")
    serializer_class = TimeSlicingPolicySerializer
    permission_classes = [OperatorPermissions]
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


# --- Reconfigurations ----------------------------------------------------------------------------


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
            "planned_at",
            "checked_at",
            "cordoned_at",
            "drained_at",
            "applied_at",
            "verified_at",
            "uncordoned_at",
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
    permission_classes = [OperatorPermissions]
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
            reconf = rc.create(
                data["node"],
                data["target"],
                source=data["source"],
                layout=data.get("layout"),
                backend=data["backend"],
                drain=data["drain"],
                force=data["force"],
                actor=request.user,
            )
        except (rc.Refused, rc.IllegalTransition) as exc:
            raise Conflict(str(exc)) from None
        except rc.ReconfigurationError as exc:
            raise serializers.ValidationError({"non_field_errors": [str(exc)]}) from None
        return Response(self.get_serializer(reconf).data, status=status.HTTP_201_CREATED)

    def _transition(self, service):
        reconf = self.get_object()
        reject_body(self.request)
        try:
            result = service(reconf, actor=self.request.user)
        except rc.IllegalTransition as exc:
            raise Conflict(str(exc)) from None
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


# --- Planning and take-offline --------------------------------------------------------------------


class SlotTierSerializer(serializers.Serializer):
    slots = serializers.IntegerField()
    by_spec = serializers.DictField(child=serializers.IntegerField())
    replicas = serializers.IntegerField(required=False)


class PlanGroupSerializer(serializers.Serializer):
    product = serializers.CharField()
    gpus = serializers.IntegerField()
    use = serializers.ChoiceField(choices=["mig", "timeslice", "full"])
    layout = serializers.ListField(child=serializers.CharField(), allow_null=True)
    replicas = serializers.IntegerField(allow_null=True)
    tiers = serializers.DictField(child=SlotTierSerializer(), help_text='Keys: "1" (MIG), "3" (time-slicing), "full".')


class CurrentPlanSerializer(serializers.Serializer):
    gpus = serializers.IntegerField()
    groups = PlanGroupSerializer(many=True)
    totals = serializers.DictField(child=SlotTierSerializer())


class ProposedPlanSerializer(serializers.Serializer):
    product = serializers.CharField()
    gpus = serializers.IntegerField()
    tiers = serializers.DictField(child=SlotTierSerializer())
    layout = serializers.ListField(child=serializers.DictField())


class CapacityPlanSerializer(serializers.Serializer):
    current = CurrentPlanSerializer()
    proposed = ProposedPlanSerializer(allow_null=True)


class CapacityPlanQuery(serializers.Serializer):
    cluster = serializers.PrimaryKeyRelatedField(queryset=Cluster.objects.all(), required=False)
    node_group = serializers.CharField(required=False)
    product = serializers.CharField(required=False)
    gpus = serializers.IntegerField(min_value=0, required=False)
    layout = serializers.CharField(required=False, help_text="Per-GPU layout, e.g. 4g.40gb,3g.40gb")
    replicas = serializers.IntegerField(min_value=2, required=False)

    def validate(self, attrs):
        if (attrs.get("layout") or attrs.get("replicas")) and not (attrs.get("product") and "gpus" in attrs):
            raise serializers.ValidationError({"product": "A proposal needs product and gpus."})
        return attrs


class CapacityPlanView(APIView):
    """Effective slots per tier, now (discovered) and for a proposed layout or replica count."""

    permission_classes = [OperatorPermissions]
    operator_perms = {"get": ("capacity.view_nodecapacity",)}

    @extend_schema(
        summary="Effective slots per tier (current and proposed)",
        parameters=[
            OpenApiParameter("cluster", int, required=False),
            OpenApiParameter("node_group", str, required=False),
            OpenApiParameter("product", str, required=False, description="Proposal: catalog key, e.g. H100-80GB"),
            OpenApiParameter("gpus", int, required=False, description="Proposal: number of GPUs"),
            OpenApiParameter("layout", str, required=False, description="Proposal: per-GPU MIG layout"),
            OpenApiParameter("replicas", int, required=False, description="Proposal: time-slice replicas"),
        ],
        responses=CapacityPlanSerializer,
    )
    def get(self, request):
        query = CapacityPlanQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        current = planning.current_capacity_plan(cluster=data.get("cluster"), node_group=data.get("node_group"))
        proposed = None
        if data.get("product") and "gpus" in data:
            try:
                proposed = planning.proposed_capacity_plan(
                    data["product"], data["gpus"], layout=data.get("layout"), timeslice_replicas=data.get("replicas")
                )
            except (ValueError, KeyError) as exc:
                raise serializers.ValidationError({"layout": [str(exc).strip('"')]}) from None
        return Response({"current": current, "proposed": proposed})


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

    permission_classes = [OperatorPermissions]
    operator_perms = {"post": ("capacity.view_nodecapacity", "pools.view_allocation")}

    @extend_schema(summary="Take-offline check", request=TakeOfflineRequest, responses=TakeOfflineSerializer)
    def post(self, request):
        form = TakeOfflineRequest(data=request.data)
        form.is_valid(raise_exception=True)
        check = maintenance.take_offline_check(
            gpus=form.validated_data.get("gpus", []), nodes=form.validated_data.get("nodes", [])
        )
        return Response(check.to_dict())


class RebalanceQuery(serializers.Serializer):
    cluster = serializers.PrimaryKeyRelatedField(queryset=Cluster.objects.all())
    product = serializers.CharField()
    days = serializers.IntegerField(min_value=1, max_value=365, default=30)

    def validate_product(self, value):
        from capacity.mig.catalog import get_product

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

    permission_classes = [OperatorPermissions]
    operator_perms = {"get": ("capacity.view_migreconfiguration",)}

    @extend_schema(
        summary="Rebalancing proposal",
        parameters=[
            OpenApiParameter("cluster", int, required=True),
            OpenApiParameter("product", str, required=True, description="Catalog key, e.g. H100-80GB"),
            OpenApiParameter("days", int, required=False, description="Demand period (default 30)"),
        ],
        responses=RebalanceSerializer,
    )
    def get(self, request):
        query = RebalanceQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        proposal = planning.propose_rebalance(data["cluster"], data["product"], days=data["days"])
        return Response(proposal.to_dict())

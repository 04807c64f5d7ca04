"""Serializers of pool requests: the request, its dry run and forecast, its transitions and queue state, the
bodies of its actions, and auto-approval policies. Resolving and matching a declaration is
pools.services.declarations' work; these only validate and shape."""

from __future__ import annotations

from decimal import Decimal

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from capacity.api.mig import WallClockTimeField
from capacity.api.strict import StrictModelSerializer, StrictSerializer
from capacity.models import Cluster
from tenancy.models import Project

from .. import services, signals
from ..choices import (
    ISOLATION_OR_NEED,
    Isolation,
    IsolationNeed,
    WorkloadType,
)
from ..models import (
    PoolRequest,
    PoolRequestTransition,
)
from ..models.queue import AutoApprovalPolicy, QueueEntry, window_error
from ..services import declarations
from .serializers import RequestingProjectMixin, UnitCountField, refused_as_400


class TransitionSerializer(serializers.ModelSerializer):
    actor = serializers.SlugRelatedField(
        slug_field="username",
        read_only=True,
        allow_null=True,
        help_text="Who moved the request; null for a move gpuaas made itself (the queue, expiry, a policy).",
    )

    class Meta:
        model = PoolRequestTransition
        fields = ["from_state", "to_state", "actor", "reason", "at"]
        read_only_fields = fields


class QueueStateSerializer(serializers.ModelSerializer):
    """Where a queued request stands: its place, hold, whether it could be approved now, its forecast."""

    position = serializers.SerializerMethodField(help_text="1-based place in the queue; null once it left.")
    can_be_approved_now = serializers.SerializerMethodField()
    served_by_age_from = serializers.SerializerMethodField(
        help_text="From then on fair share no longer orders it: no later request of its class overtakes it "
        "(QUEUE_AGED_AFTER_H after queued_at). Null when ageing is off or an operator moved it."
    )

    class Meta:
        model = QueueEntry
        fields = [
            "queued_at",
            "position",
            "on_hold",
            "can_be_approved_now",
            "served_by_age_from",
            "approvable_at",
            "forecast_p50",
            "forecast_p90",
            "forecast_at",
            "forecast_basis",
            "first_p50",
            "operator_approved_at",
            "running_on_loan_since",
            "first_on_loan_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_position(self, entry: QueueEntry) -> int | None:
        return self.context.get("position", {}).get(entry.request_id)

    @extend_schema_field(serializers.BooleanField())
    def get_can_be_approved_now(self, entry: QueueEntry) -> bool:
        return entry.approvable_at is not None and not entry.on_hold

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_served_by_age_from(self, entry: QueueEntry):
        policy = self.context.get("queue_policy")  # scheduling's QueuePolicy: the view that serves the queue gives it
        at = policy.aged_at(entry.queued_at) if policy is not None and entry.manual_rank is None else None
        return None if at is None else serializers.DateTimeField().to_representation(at)


VGPU_TYPE_HELP = "A VM's vGPU type, e.g. H100XM-20C: one the fleet's vm-vgpu nodes offer. Implies vm."


ISOLATION_HELP = (
    "A need (none, memory, hardware; empty: the workload's default) lets matching choose the offer;"
    " a kind (mig, full, timeslice), a tier or a profile pins the spec."
)


class PoolRequestSerializer(RequestingProjectMixin, StrictModelSerializer):
    """A pool request. On create, `project` must be one of yours (else 400 "does not exist").

    Declare needs (memory_gib, compute_fraction, isolation as a need, end_at, workload_type) and
    matching (pools/units/matching.py) chooses the offer and records why in `offer` and `offer_reason`; or
    pin the spec with a profile_name, a tier or an isolation kind. `submit: true` submits it at once.
    """

    project = serializers.PrimaryKeyRelatedField(queryset=Project.objects.none())
    project_slug = serializers.CharField(source="project.slug", read_only=True)
    count = UnitCountField(required=False)
    cluster = serializers.PrimaryKeyRelatedField(queryset=Cluster.objects.all(), required=False, allow_null=True)
    cluster_name = serializers.CharField(source="cluster.name", read_only=True, default=None, allow_null=True)
    isolation = serializers.ChoiceField(choices=ISOLATION_OR_NEED, required=False, help_text=ISOLATION_HELP)
    declared_isolation = serializers.ChoiceField(
        choices=[("", "Not declared (the spec was pinned)"), *IsolationNeed.choices],
        read_only=True,
        help_text="The isolation need matching worked from; empty when the request pinned its spec.",
    )
    requested_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    approved_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    pool = serializers.SerializerMethodField()
    spec = serializers.CharField(source="spec_label", read_only=True)
    tags = serializers.ListField(child=serializers.CharField(max_length=64), required=False, max_length=20)
    submit = serializers.BooleanField(write_only=True, required=False, default=False)
    vm = serializers.BooleanField(
        write_only=True, required=False, default=False, help_text="A virtual machine (KubeVirt): only vGPUs serve it."
    )
    vgpu_type = serializers.CharField(
        write_only=True, required=False, allow_blank=True, default="", max_length=32, help_text=VGPU_TYPE_HELP
    )
    approved_by_policy = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    queue = serializers.SerializerMethodField()

    class Meta:
        model = PoolRequest
        fields = [
            "id",
            "project",
            "project_slug",
            "name",
            "workload_type",
            "isolation",
            "tier",
            "cluster",
            "cluster_name",
            "product",
            "spec_kind",
            "profile_name",
            "spec",
            "count",
            "memory_gib",
            "compute_fraction",
            "declared_isolation",
            "offer",
            "offer_reason",
            "start_at",
            "end_at",
            "justification",
            "tags",
            "wait_if_full",
            "priority_class",
            "allow_multi_cluster",
            "state",
            "state_reason",
            "requested_by",
            "approved_by",
            "approved_by_policy",
            "approved_at",
            "expiry_notice_at",
            "pool",
            "queue",
            "created_at",
            "updated_at",
            "submit",
            "vm",
            "vgpu_type",
        ]
        read_only_fields = [
            "spec_kind",
            "declared_isolation",
            "offer",
            "offer_reason",
            "state",
            "state_reason",
            "approved_at",
            "expiry_notice_at",
            "created_at",
            "updated_at",
        ]
        extra_kwargs = {
            "start_at": {"required": False},
        }

    @extend_schema_field(serializers.IntegerField(allow_null=True, help_text="The pool, once approved; else null."))
    def get_pool(self, obj: PoolRequest) -> int | None:
        pool = getattr(obj, "pool", None)
        return pool.pk if pool is not None else None

    @extend_schema_field(QueueStateSerializer(allow_null=True))
    def get_queue(self, obj: PoolRequest) -> dict | None:
        entry = getattr(obj, "queue_entry", None)
        if entry is None:
            return None
        context = {
            "position": self.context.get("queue_positions", {}),
            "queue_policy": self.context.get("queue_policy"),
        }
        return QueueStateSerializer(entry, context=context).data

    def validate(self, attrs: dict) -> dict:
        now = timezone.now()
        start = attrs.get("start_at") or now
        end = attrs.get("end_at")
        if end is not None and end <= start:
            raise serializers.ValidationError({"end_at": "The end must be after the start."})
        if end is not None and end <= now:
            raise serializers.ValidationError({"end_at": "The end must be in the future."})
        attrs["start_at"] = start
        if attrs.get("isolation") == Isolation.VGPU:  # a vGPU is chosen by matching, for a VM
            attrs["vm"], attrs["isolation"] = True, ""
        attrs = refused_as_400(declarations.resolve, attrs)
        attrs.pop("vm", None)  # declarations only: the chosen spec (spec_kind vgpu, its type) is what is stored
        attrs.pop("vgpu_type", None)
        return attrs

    def create(self, validated_data: dict) -> PoolRequest:
        submit = validated_data.pop("submit", False)
        project = validated_data.pop("project")
        created = services.create_request(project, actor=self.context["request"].user, submit=submit, **validated_data)
        if submit:  # approved by a policy, queued, or left for an operator (scheduling.queue.after_submit)
            signals.request_submitted.send(sender=PoolRequest, request=created)
        return created


class DryRunSerializer(StrictSerializer):
    """What a team declares; the dry run answers with ranked offers, prices and a start forecast."""

    workload_type = serializers.ChoiceField(choices=WorkloadType.choices, default=WorkloadType.INFERENCE)
    memory_gib = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    compute_fraction = serializers.DecimalField(
        max_digits=4,
        decimal_places=3,
        min_value=Decimal("0.001"),
        max_value=Decimal(1),
        required=False,
        allow_null=True,
    )
    isolation = serializers.ChoiceField(choices=IsolationNeed.choices, required=False, allow_blank=True, default="")
    count = UnitCountField(default=1)
    product = serializers.CharField(max_length=32, required=False, allow_blank=True, default="")
    cluster = serializers.PrimaryKeyRelatedField(queryset=Cluster.objects.all(), required=False, allow_null=True)
    start_at = serializers.DateTimeField(required=False, allow_null=True)
    end_at = serializers.DateTimeField(required=False, allow_null=True)
    vm = serializers.BooleanField(default=False, help_text="A virtual machine (KubeVirt): only vGPUs serve it.")
    vgpu_type = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=32, help_text=VGPU_TYPE_HELP
    )

    def validate(self, attrs: dict) -> dict:
        start, end = attrs.get("start_at") or timezone.now(), attrs.get("end_at")
        if end is not None and end <= start:
            raise serializers.ValidationError({"end_at": "The end must be after the start."})
        attrs["start_at"] = start
        refused_as_400(declarations.check_vgpu_type, attrs)
        return attrs

    def declared(self) -> dict:
        """The declaration, as offers.match_declared() takes it (the dry run adds a start forecast per offer)."""
        return declarations.declared(self.validated_data)


class PoolRequestDetailSerializer(PoolRequestSerializer):
    transitions = TransitionSerializer(many=True, read_only=True)

    class Meta(PoolRequestSerializer.Meta):
        fields = [*PoolRequestSerializer.Meta.fields, "transitions"]


class ReasonSerializer(StrictSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class RejectSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=2000)


class ApproveSerializer(ReasonSerializer):
    cluster = serializers.PrimaryKeyRelatedField(
        queryset=Cluster.objects.all(), required=False, allow_null=True, help_text="Take units from this cluster only."
    )


class MoveSerializer(ReasonSerializer):
    position = serializers.IntegerField(min_value=1, help_text="1-based place in the queue.")


class ForecastRequestSerializer(PoolRequestSerializer):
    """A dry run: the fields of a new request; nothing is saved."""

    class Meta(PoolRequestSerializer.Meta):
        fields = [f for f in PoolRequestSerializer.Meta.fields if f != "submit"]


class ForecastSerializer(serializers.Serializer):
    """Estimated start: P50 and P90 (null when the fleet could never hold it), and what it rests on."""

    p50 = serializers.DateTimeField(allow_null=True)
    p90 = serializers.DateTimeField(allow_null=True)
    basis = serializers.DictField()


class AutoApprovalPolicySerializer(StrictModelSerializer):
    projects = serializers.PrimaryKeyRelatedField(queryset=Project.objects.all(), many=True, required=False)
    window_start = WallClockTimeField(required=False, allow_null=True, help_text="UTC; empty with the end: all day.")
    window_end = WallClockTimeField(required=False, allow_null=True, help_text="UTC; before the start = over midnight.")

    class Meta:
        model = AutoApprovalPolicy
        fields = ["id", "name", "enabled", "projects", *AutoApprovalPolicy.RULE_FIELDS, "created_at"]
        read_only_fields = ["created_at"]

    def validate(self, attrs: dict) -> dict:
        start = attrs.get("window_start", getattr(self.instance, "window_start", None))
        end = attrs.get("window_end", getattr(self.instance, "window_end", None))
        error = window_error(start, end)
        if error:
            raise serializers.ValidationError({"window_end": error})
        return attrs


class ConflictSerializer(serializers.Serializer):
    """409: the request's state does not allow it, or capacity is short (with what is missing)."""

    detail = serializers.CharField()
    state = serializers.CharField(required=False)
    need = serializers.IntegerField(required=False)
    free = serializers.IntegerField(required=False)
    reconfiguration = serializers.DictField(required=False, allow_null=True)

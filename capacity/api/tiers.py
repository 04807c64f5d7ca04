"""Tier placement for operators: assign nodes to tiers (gpuaas writes the labels) and set each tier's MIG profiles."""

from __future__ import annotations

from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, viewsets
from rest_framework.validators import UniqueValidator

from capacity.api.strict import StrictModelSerializer
from capacity.choices import Tier
from capacity.models import NodeCapacity, TierAssignment, TierProfilePolicy
from capacity.services import tiers as tier_services
from capacity.tiers import DEFAULT_POLICIES, policy_label
from core.scopes import Scope


class TierAssignmentSerializer(StrictModelSerializer):
    node = serializers.PrimaryKeyRelatedField(queryset=NodeCapacity.objects.present())
    node_name = serializers.CharField(source="node.name", read_only=True)
    cluster = serializers.IntegerField(source="node.cluster_id", read_only=True)
    tier = serializers.ChoiceField(choices=Tier.choices, allow_blank=True)

    class Meta:
        model = TierAssignment
        fields = ["id", "node", "node_name", "cluster", "tier", "assigned_at", "labelled_at", "last_error"]
        read_only_fields = ["assigned_at", "labelled_at", "last_error"]

    def validate_node(self, node: NodeCapacity) -> NodeCapacity:
        if self.instance is not None and node.pk != self.instance.node_id:
            raise serializers.ValidationError("An assignment stays with its node; delete it and assign the other node.")
        return node

    def save(self, **kwargs):
        user = self.context["request"].user
        node = self.validated_data.get("node") or self.instance.node
        tier = self.validated_data.get("tier", self.instance.tier if self.instance is not None else "")
        self.instance = tier_services.assign_tier(node, tier, actor=user)
        return self.instance


class TierAssignmentFilter(filters.FilterSet):
    cluster = filters.NumberFilter(field_name="node__cluster")

    class Meta:
        model = TierAssignment
        fields = ["tier", "cluster"]


@extend_schema_view(
    list=extend_schema(summary="Nodes whose tier gpuaas owns (it writes their gpuaas.io/tier label)"),
    create=extend_schema(summary="Assign a node to a tier: the label is written after commit and kept in step"),
    destroy=extend_schema(summary="Stop owning a node's tier (the label stays; discovery reads it again)"),
)
class TierAssignmentViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    queryset = TierAssignment.objects.select_related("node").order_by("node__cluster_id", "node__name")
    serializer_class = TierAssignmentSerializer
    scope = Scope.OPERATOR
    filterset_class = TierAssignmentFilter
    ordering_fields = ["id", "tier"]

    def perform_destroy(self, instance: TierAssignment) -> None:
        tier_services.unassign_tier(instance.node)


class TierProfilePolicySerializer(StrictModelSerializer):
    # Every tier has its row from the start (migration 0020): a second one is a 400 that says to edit it.
    tier = serializers.ChoiceField(
        choices=Tier.choices,
        allow_blank=True,
        validators=[
            UniqueValidator(
                queryset=TierProfilePolicy.objects.all(),
                message="This tier already has its policy: change that row (PATCH tier-policies/<id>/).",
            )
        ],
    )
    default = serializers.SerializerMethodField(help_text="The seed's recommendation for this tier.")

    class Meta:
        model = TierProfilePolicy
        fields = ["id", "tier", "min_compute_slices", "max_compute_slices", "notes", "default", "updated_at"]
        read_only_fields = ["updated_at"]

    def get_default(self, obj: TierProfilePolicy) -> str:
        return policy_label(obj.tier, DEFAULT_POLICIES)

    def validate(self, attrs: dict) -> dict:
        low = attrs.get("min_compute_slices", getattr(self.instance, "min_compute_slices", 1))
        high = attrs.get("max_compute_slices", getattr(self.instance, "max_compute_slices", 8))
        if low > high:
            message = "The largest profile must be at least the smallest."
            raise serializers.ValidationError({"max_compute_slices": message})
        return attrs


@extend_schema_view(
    list=extend_schema(summary="MIG profiles per tier (one row per tier; the built-in defaults were written as rows)")
)
class TierProfilePolicyViewSet(viewsets.ModelViewSet):
    """Which MIG profiles each tier carries; approval, matching and the planners read it (capacity.tiers)."""

    queryset = TierProfilePolicy.objects.order_by("tier")
    serializer_class = TierProfilePolicySerializer
    scope = Scope.OPERATOR
    filterset_class = None
    ordering_fields = ["tier"]

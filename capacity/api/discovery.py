"""Capacity API for operators: clusters, discovery runs, GPU nodes, GPUs and offered specs (read-only), and
one write, a vm-vgpu node's vGPU type (capacity.services.vgpu).

What discovery mirrors from the clusters. Operators only (staff holding the model's view permission):
these are shared hardware facts, not one project's objects, so anyone else gets 403. Lists are
ordered, filtered through explicit FilterSets, and counted with correlated subqueries rather than JOINs.
"""

from __future__ import annotations

from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from capacity.choices import MigInstanceState, SpecKind, Tier
from capacity.models import Cluster, DiscoveryRun, GpuCapacity, MigInstance, NodeCapacity, SpecAndCount
from capacity.services import vgpu
from core.scopes import Scope

from .onboarding import NodeAgentSerializer, OnboardActionMixin, OnboardingSerializer, agents_of


def _count(queryset, group_by: str):
    return Coalesce(
        Subquery(queryset.order_by().values(group_by).annotate(n=Count("pk")).values("n"), output_field=IntegerField()),
        0,
    )


# --- Serializers -------------------------------------------------------------------------------


class ClusterSerializer(serializers.ModelSerializer):
    nodes = serializers.IntegerField(source="_nodes", read_only=True)
    gpus = serializers.IntegerField(source="_gpus", read_only=True)

    class Meta:
        model = Cluster
        fields = [
            "id",
            "name",
            "api_endpoint",
            "status",
            "binding",
            "last_discovery_at",
            "last_success_at",
            "last_error",
            "nodes",
            "gpus",
        ]
        read_only_fields = fields


class ClusterDetailSerializer(ClusterSerializer):
    agents = serializers.SerializerMethodField(help_text="Each present node's agent: version, last report, health.")
    last_onboarding = serializers.SerializerMethodField()

    class Meta(ClusterSerializer.Meta):
        fields = [*ClusterSerializer.Meta.fields, "agents", "last_onboarding"]
        read_only_fields = fields

    @extend_schema_field(NodeAgentSerializer(many=True))
    def get_agents(self, cluster) -> list[dict]:
        return agents_of(cluster)

    @extend_schema_field(OnboardingSerializer(allow_null=True))
    def get_last_onboarding(self, cluster) -> dict | None:
        row = cluster.onboardings.select_related("actor").first()
        return OnboardingSerializer(row).data if row else None


class DiscoveryRunSerializer(serializers.ModelSerializer):
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = DiscoveryRun
        fields = [
            "id",
            *DiscoveryRun.SUMMARY_FIELDS,
            "error",
            "task_id",
        ]
        read_only_fields = fields


class NodeSerializer(serializers.ModelSerializer):
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)
    gpus_present = serializers.IntegerField(source="_gpus", read_only=True)
    mig_instances = serializers.IntegerField(source="_migs", read_only=True)
    agent_health = serializers.SerializerMethodField(help_text="ok, stale, or never (its agent never reported).")

    class Meta:
        model = NodeCapacity
        fields = [
            "id",
            "cluster",
            "name",
            "gpu_product",
            "gpu_count",
            "gpus_present",
            "mig_instances",
            *NodeCapacity.LABELLED_FIELDS,
            "vgpu_config",
            "vgpu_config_state",
            "timeslice_replicas",
            "ready",
            "cordoned",
            "first_seen_at",
            "last_seen_at",
            "gone_at",
            "agent_version",
            "agent_reported_at",
            "agent_health",
        ]
        read_only_fields = fields

    def get_agent_health(self, node) -> str:
        return node.agent_health()


class GpuSerializer(serializers.ModelSerializer):
    node = serializers.SlugRelatedField(slug_field="name", read_only=True)
    cluster = serializers.CharField(source="node.cluster.name", read_only=True)

    class Meta:
        model = GpuCapacity
        fields = [
            "id",
            "cluster",
            "node",
            "index",
            "uuid",
            *GpuCapacity.REPORTED_FIELDS,
            "last_seen_at",
            "lost_at",
        ]
        read_only_fields = fields


class SpecSerializer(serializers.ModelSerializer):
    node = serializers.SlugRelatedField(slug_field="name", read_only=True)
    cluster = serializers.CharField(source="node.cluster.name", read_only=True)
    label = serializers.CharField(read_only=True)

    class Meta:
        model = SpecAndCount
        fields = [
            "id",
            "cluster",
            "node",
            "kind",
            "product",
            "profile_name",
            "resource_name",
            "count",
            "allocatable",
            "replicas",
            "label",
            "updated_at",
        ]
        read_only_fields = fields


class SpecTotalSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=SpecKind.choices)
    product = serializers.CharField()
    profile_name = serializers.CharField()
    resource_name = serializers.CharField()
    count = serializers.IntegerField()
    allocatable = serializers.IntegerField()
    label = serializers.CharField(help_text='e.g. "H100-80GB 3g.40gb x 12"')


# --- Filters -----------------------------------------------------------------------------------


class NodeFilter(filters.FilterSet):
    cluster = filters.CharFilter(field_name="cluster__name")
    tier = filters.ChoiceFilter(choices=Tier.choices)
    gone = filters.BooleanFilter(field_name="gone_at", lookup_expr="isnull", exclude=True)

    class Meta:
        model = NodeCapacity
        fields = ["cluster", "gpu_product", "tier", "node_group", "mig_strategy", "ready", "cordoned", "gone"]


class GpuFilter(filters.FilterSet):
    cluster = filters.CharFilter(field_name="node__cluster__name")
    node = filters.CharFilter(field_name="node__name")
    lost = filters.BooleanFilter(field_name="lost_at", lookup_expr="isnull", exclude=True)

    class Meta:
        model = GpuCapacity
        fields = ["cluster", "node", "catalog_product", "health", "mig_mode_current", "lost"]


class SpecFilter(filters.FilterSet):
    cluster = filters.CharFilter(field_name="node__cluster__name")
    node = filters.CharFilter(field_name="node__name")
    tier = filters.ChoiceFilter(field_name="node__tier", choices=Tier.choices)

    class Meta:
        model = SpecAndCount
        fields = ["cluster", "node", "tier", "kind", "product", "profile_name"]


class RunFilter(filters.FilterSet):
    cluster = filters.CharFilter(field_name="cluster__name")

    class Meta:
        model = DiscoveryRun
        fields = ["cluster", "status"]


# --- Views -------------------------------------------------------------------------------------


class ClusterViewSet(OnboardActionMixin, viewsets.ReadOnlyModelViewSet):
    """Registered clusters with their discovery status and present node/GPU counts; the detail adds each node's
    agent health and the latest onboarding; `onboard` installs the node agent (capacity/api/onboarding.py)."""

    serializer_class = ClusterSerializer
    scope = Scope.OPERATOR
    operator_perms = {"onboard": ("capacity.change_cluster",)}

    def get_serializer_class(self):
        return ClusterDetailSerializer if self.action == "retrieve" else ClusterSerializer

    filterset_fields = ["status"]
    ordering_fields = ["name", "last_success_at"]

    def get_queryset(self):
        nodes = NodeCapacity.objects.filter(cluster=OuterRef("pk"), gone_at__isnull=True)
        gpus = GpuCapacity.objects.filter(
            node__cluster=OuterRef("pk"), node__gone_at__isnull=True, lost_at__isnull=True
        )
        return Cluster.objects.annotate(_nodes=_count(nodes, "cluster"), _gpus=_count(gpus, "node__cluster")).order_by(
            "name"
        )


class DiscoveryRunViewSet(viewsets.ReadOnlyModelViewSet):
    """Discovery runs, newest first: what each pass saw and why it failed."""

    serializer_class = DiscoveryRunSerializer
    scope = Scope.OPERATOR
    filterset_class = RunFilter
    queryset = DiscoveryRun.objects.select_related("cluster").order_by("-started_at", "-id")


class VgpuConfigSerializer(serializers.Serializer):
    vgpu_type = serializers.CharField(max_length=32, help_text="A catalog vGPU type of the node's GPU: H100XM-20C.")


class VgpuConfigChangeSerializer(serializers.Serializer):
    node = serializers.CharField()
    vgpu_type = serializers.CharField()
    changed = serializers.BooleanField(help_text="False when the node's label already named this type.")


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    """GPU nodes (gone ones included; filter gone=false for the present fleet)."""

    serializer_class = NodeSerializer
    scope = Scope.OPERATOR
    operator_perms = {"vgpu_config": ("capacity.change_nodecapacity",)}
    filterset_class = NodeFilter
    ordering_fields = ["name", "gpu_product", "tier"]

    def get_queryset(self):
        gpus = GpuCapacity.objects.filter(node=OuterRef("pk"), lost_at__isnull=True)
        migs = MigInstance.objects.filter(
            gpu__node=OuterRef("pk"), gpu__lost_at__isnull=True, state=MigInstanceState.ACTIVE
        )
        return (
            NodeCapacity.objects.select_related("cluster")
            .annotate(_gpus=_count(gpus, "node"), _migs=_count(migs, "gpu__node"))
            .order_by("cluster__name", "name")
        )

    @extend_schema(
        summary="Set a vm-vgpu node's vGPU type (device manager ConfigMap + nvidia.com/vgpu.config label)",
        request=VgpuConfigSerializer,
        responses={200: VgpuConfigChangeSerializer, 503: None},
    )
    @action(detail=True, methods=["post"], url_path="vgpu-config")
    def vgpu_config(self, request, pk=None):
        node = self.get_object()
        body = VgpuConfigSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            change = vgpu.set_vgpu_config(node, body.validated_data["vgpu_type"])
        except vgpu.VgpuConfigError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from exc
        except vgpu.ClusterRefused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_503_SERVICE_UNAVAILABLE)
        return Response(VgpuConfigChangeSerializer(change).data)


class GpuViewSet(viewsets.ReadOnlyModelViewSet):
    """Physical GPUs as the node agents' NVML inventory reports them (lost ones kept, with lost_at)."""

    serializer_class = GpuSerializer
    scope = Scope.OPERATOR
    filterset_class = GpuFilter
    queryset = GpuCapacity.objects.select_related("node__cluster").order_by(
        "node__cluster__name", "node__name", "index"
    )


class SpecViewSet(viewsets.ReadOnlyModelViewSet):
    """What each node offers, by extended resource; `totals` sums them for the present fleet."""

    serializer_class = SpecSerializer
    scope = Scope.OPERATOR
    filterset_class = SpecFilter
    queryset = SpecAndCount.objects.select_related("node__cluster").order_by(
        "node__cluster__name", "node__name", "kind"
    )

    @extend_schema(
        summary="Totals by spec over present nodes",
        description='One row per (product, kind, profile, resource), e.g. "H100-80GB 3g.40gb x 12". '
        "Takes the same filters as the list.",
        responses=SpecTotalSerializer(many=True),
    )
    @action(detail=False, pagination_class=None)
    def totals(self, request):
        rows = []
        for total in self.filter_queryset(self.get_queryset()).totals():
            spec = SpecAndCount(
                kind=total["kind"], product=total["product"], profile_name=total["profile_name"], replicas=1
            )
            shared = {SpecKind.TIMESLICE: "time-slice", SpecKind.MPS: "MPS client"}.get(total["kind"])
            name = f"{total['product']} {shared}" if shared else spec.label
            rows.append({**total, "label": f"{name} x {total['count']}"})
        return Response(SpecTotalSerializer(rows, many=True).data)

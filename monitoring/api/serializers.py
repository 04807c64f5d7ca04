"""Serializers of the monitoring API: rows out, and the validated query of time-series reads."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api import QuerySerializer
from pools.api.serializers import PoolClusterSerializer

from ..choices import RollupLevel
from ..models import HealthEvent, IdleReservation, Series, TrespassEvent, TrespassSides
from ..readers import AGGREGATES, METRICS

MAX_RANGE = timedelta(days=400)
MAX_RAW_RANGE = timedelta(days=2)


class SeriesSerializer(serializers.ModelSerializer):
    kind = serializers.SerializerMethodField()
    cluster = serializers.CharField(source="gpu.node.cluster.name", read_only=True)
    node = serializers.CharField(source="gpu.node.name", read_only=True)
    gpu_uuid = serializers.CharField(source="gpu.uuid", read_only=True)
    gpu_index = serializers.IntegerField(source="gpu.index", read_only=True)
    product = serializers.CharField(source="gpu.catalog_product", read_only=True)
    mig_instance_uuid = serializers.CharField(source="mig_instance.uuid", read_only=True, default=None, allow_null=True)
    profile = serializers.CharField(source="mig_instance.profile.name", read_only=True, default=None, allow_null=True)
    gi_id = serializers.IntegerField(source="mig_instance.gi_id", read_only=True, default=None, allow_null=True)

    class Meta:
        model = Series
        fields = [
            "id",
            "kind",
            "cluster",
            "node",
            "gpu_uuid",
            "gpu_index",
            "product",
            "mig_instance_uuid",
            "profile",
            "gi_id",
            "mem_total_mib",
            "source",
        ]

    def get_kind(self, obj: Series) -> str:
        return "mig" if obj.mig_instance_id else "gpu"


class RangeQuerySerializer(QuerySerializer):
    """?start=&end= (ISO 8601; default: the last 24 h) and ?step= (auto, raw, 5m, 1h)."""

    start = serializers.DateTimeField(required=False)
    end = serializers.DateTimeField(required=False)
    step = serializers.ChoiceField(choices=["auto", "raw", *RollupLevel.values], default="auto")

    def validate(self, attrs):
        end = attrs.get("end") or timezone.now()
        try:
            start = attrs.get("start") or end - timedelta(hours=24)
        except OverflowError:  # an end within a day of 0001-01-01: the default start would come before it
            raise serializers.ValidationError({"end": "too early to read the day before it; give start."}) from None
        if start >= end:
            raise serializers.ValidationError({"start": "start must be before end."})
        if end - start > MAX_RANGE:
            raise serializers.ValidationError({"start": f"at most {MAX_RANGE.days} days per read."})
        if attrs["step"] == "raw" and end - start > MAX_RAW_RANGE:
            raise serializers.ValidationError({"step": "raw samples: at most 2 days per read; use 5m or 1h."})
        attrs["start"], attrs["end"] = start, end
        return attrs


class SampleQuerySerializer(RangeQuerySerializer):
    aggregate = serializers.ChoiceField(choices=AGGREGATES, default="avg", help_text="Of rollup buckets.")
    metrics = serializers.MultipleChoiceField(choices=METRICS, required=False, help_text="Default: all.")


class PointSerializer(serializers.Serializer):
    ts = serializers.DateTimeField()
    power_w = serializers.FloatField(allow_null=True, required=False)
    sm_active = serializers.FloatField(allow_null=True, required=False, help_text="Percent.")
    gpu_util = serializers.FloatField(allow_null=True, required=False, help_text="Percent.")
    mem_used_mib = serializers.FloatField(allow_null=True, required=False)
    temp_c = serializers.FloatField(allow_null=True, required=False)


class SeriesSamplesSerializer(serializers.Serializer):
    series = serializers.IntegerField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    step = serializers.CharField()
    aggregate = serializers.CharField()
    points = PointSerializer(many=True)


class PoolPointSerializer(serializers.Serializer):
    ts = serializers.DateTimeField()
    sm_active = serializers.FloatField(help_text="Compute-slice-weighted average of the units, percent.")
    units = serializers.IntegerField(help_text="Units with a value in this step.")


class PodUnitSerializer(serializers.Serializer):
    allocation = serializers.IntegerField()
    kind = serializers.CharField()
    uuid = serializers.CharField(help_text="The MIG instance's or GPU's UUID.")
    sm_active_avg = serializers.FloatField(
        allow_null=True, help_text="While the pod ran on it and the pool held it, percent; null: no data."
    )
    sm_active_max = serializers.FloatField(allow_null=True)
    mem_used_max_mib = serializers.IntegerField(allow_null=True)


class PoolPodSerializer(serializers.Serializer):
    namespace = serializers.CharField()
    pod = serializers.CharField()
    resource = serializers.CharField()
    started_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True)
    units = PodUnitSerializer(many=True, help_text="The pool's units the kubelet gave the pod, every one of them.")


class PoolUtilisationSerializer(serializers.Serializer):
    pool = serializers.IntegerField()
    name = serializers.CharField()
    project = serializers.CharField()
    cluster = serializers.CharField(help_text="The home cluster (GpuPool.cluster).")
    clusters = PoolClusterSerializer(
        many=True, help_text="Every cluster the pool holds units on, home first, with its units there now."
    )
    state = serializers.CharField()
    units = serializers.IntegerField(help_text="Active allocations.")
    measured_units = serializers.IntegerField(help_text="Units with their own series (MIG, full GPU).")
    sm_active_avg = serializers.FloatField(allow_null=True, help_text="Over the range, percent; null: no data.")
    open_health_events = serializers.IntegerField()
    open_idle_flags = serializers.IntegerField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    step = serializers.CharField()
    points = PoolPointSerializer(many=True, required=False)
    pods = PoolPodSerializer(
        many=True,
        required=False,
        help_text="One pool (retrieve): which of the project's pods used which unit over the range, and how hard.",
    )


class HealthEventSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="gpu.node.cluster.name", read_only=True)
    node = serializers.CharField(source="gpu.node.name", read_only=True)
    gpu_uuid = serializers.CharField(source="gpu.uuid", read_only=True)
    gpu_index = serializers.IntegerField(source="gpu.index", read_only=True)
    mig_instance_uuid = serializers.CharField(source="mig_instance.uuid", read_only=True, default=None, allow_null=True)
    profile = serializers.CharField(source="mig_instance.profile.name", read_only=True, default=None, allow_null=True)
    is_open = serializers.BooleanField(read_only=True)

    class Meta:
        model = HealthEvent
        fields = [
            "id",
            "cluster",
            "node",
            "gpu_uuid",
            "gpu_index",
            "mig_instance_uuid",
            "profile",
            "rule",
            "level",
            "source",
            "value",
            "message",
            "opened_at",
            "last_seen_at",
            "occurrences",
            "resolved_at",
            "is_open",
        ]


class IdleReservationSerializer(serializers.ModelSerializer):
    project = serializers.CharField(source="allocation.project.slug", read_only=True)
    pool = serializers.IntegerField(source="allocation.pool_id", read_only=True)
    unit = serializers.CharField(source="allocation.profile_name", read_only=True)
    gpu_uuid = serializers.CharField(source="allocation.gpu.uuid", read_only=True)

    class Meta:
        model = IdleReservation
        fields = [
            "id",
            "allocation",
            "project",
            "pool",
            "unit",
            "gpu_uuid",
            "window_start",
            "window_end",
            "sm_active_avg",
            "sm_active_max",
            "mem_used_max_mib",
            "coverage",
            "proposal",
            "suggested_profile",
            "state",
            "detected_at",
            "closed_at",
        ]


class TrespassEventSerializer(serializers.ModelSerializer):
    """A trespass event. To a project member, the other side is "another project" and nothing names it: the
    namespace and pod are shown only when the pod is one of the member's own projects' (docs/monitoring.md)."""

    cluster = serializers.CharField(source="gpu.node.cluster.name", read_only=True)
    node = serializers.CharField(source="gpu.node.name", read_only=True)
    gpu_uuid = serializers.CharField(source="gpu.uuid", read_only=True)
    mig_instance_uuid = serializers.CharField(source="mig_instance.uuid", read_only=True, default=None, allow_null=True)
    profile = serializers.CharField(source="mig_instance.profile.name", read_only=True, default=None, allow_null=True)
    owner_project = serializers.SerializerMethodField(help_text="Slug of the unit's holder; null when unallocated.")
    project = serializers.SerializerMethodField(
        help_text='Slug of the offending project; "another project" to a member when the pod is not one of theirs; '
        "null when no pod is known."
    )
    namespace = serializers.SerializerMethodField(help_text="The pod's namespace; null to a member unless it is theirs")
    pod_name = serializers.SerializerMethodField(help_text="The pod; null to a member unless it is theirs")
    state = serializers.CharField(read_only=True)

    class Meta:
        model = TrespassEvent
        fields = [
            "id",
            "kind",
            "state",
            "cluster",
            "node",
            "gpu_uuid",
            "mig_instance_uuid",
            "profile",
            "owner_project",
            "project",
            "namespace",
            "pod_name",
            "sm_active",
            "mem_used_mib",
            "started_at",
            "last_seen_at",
            "ended_at",
            "evicted_at",
        ]

    def _sides(self, event) -> TrespassSides:
        return event.as_seen_by(self.context.get("visible_project_ids"))

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_owner_project(self, event) -> str | None:
        return self._sides(event).owner

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_project(self, event) -> str | None:
        return self._sides(event).project

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_namespace(self, event) -> str | None:
        return self._sides(event).namespace

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_pod_name(self, event) -> str | None:
        return self._sides(event).pod_name

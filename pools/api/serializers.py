"""Serializers of the self-service API: projects, members, pools, allocations, tokens, best-effort requests.

Pool requests' own serializers are in request_serializers; the project check they share is here."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import exceptions, serializers

from capacity.api.strict import StrictModelSerializer, StrictSerializer
from capacity.choices import AllocationState, Binding
from capacity.models import Cluster
from policies import policy
from tenancy import roles
from tenancy.choices import Role
from tenancy.models import ApiToken, Project

from .. import services
from ..choices import (
    Isolation,
    PoolClusterState,
    SharePriority,
)
from ..exceptions import SpecError
from ..models import (
    SHARED_NODE_NOTE,
    Allocation,
    BestEffortRequest,
    GpuPool,
    PoolCluster,
    gpu_count,
)

# --- Projects and members ------------------------------------------------------------------------


class ProjectSerializer(serializers.ModelSerializer):
    my_role = serializers.SerializerMethodField(help_text="Your role here: admin, member, viewer, or null.")

    class Meta:
        model = Project
        fields = ["id", "name", "slug", "namespace", "cost_centre", "description", "created_at", "my_role"]
        read_only_fields = fields

    @extend_schema_field(serializers.ChoiceField(choices=Role.choices, allow_null=True))
    def get_my_role(self, project: Project) -> str | None:
        return roles.role_from_annotations(project)


class MemberSerializer(StrictSerializer):
    user = serializers.IntegerField(read_only=True)
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)

    def validate_username(self, value: str) -> str:
        user = get_user_model().objects.filter(username=value, is_active=True).first()
        if user is None:
            raise serializers.ValidationError(f"No active user {value!r}.")
        self.context["member"] = user
        return value


class RoleSerializer(StrictSerializer):
    role = serializers.ChoiceField(choices=Role.choices)


# --- Requesting capacity: what pool and best-effort requests share -------------------------------

TOO_MANY_UNITS = "At most {max_value} units per request (POOL_REQUEST_MAX_UNITS)."


def check_count(count: int) -> int:
    """The count against POOL_REQUEST_MAX_UNITS as it is now: a field's max_value would fix it at import."""
    cap = policy("POOL_REQUEST_MAX_UNITS")
    if count > cap:
        raise serializers.ValidationError(TOO_MANY_UNITS.format(max_value=cap))
    return count


class UnitCountField(serializers.IntegerField):
    """A request's count of units: at least 1, at most the POOL_REQUEST_MAX_UNITS policy when it is validated.

    The schema's maximum is that policy when the schema is generated (gpuaas.schema reads `schema_maximum`).
    """

    def __init__(self, **kwargs):
        super().__init__(min_value=1, validators=[check_count], **kwargs)

    @staticmethod
    def schema_maximum() -> int:
        return policy("POOL_REQUEST_MAX_UNITS")


def refused_as_400(resolve, *args, **kwargs):
    """`resolve(*args, **kwargs)`, its SpecError answered as a 400 on the fields it names."""
    try:
        return resolve(*args, **kwargs)
    except SpecError as exc:
        raise serializers.ValidationError(exc.errors) from None


class RequestingProjectMixin:
    """A `project` the caller names to request capacity in: one they can see (the others do not exist, to
    them: 400 "object does not exist", never a hint), where their role may request capacity (else 403)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None and "project" in self.fields:
            self.fields["project"].queryset = roles.projects_for(request.user)

    def validate_project(self, project: Project) -> Project:
        if not services.may_request_capacity(self.context["request"].user, project):
            raise exceptions.PermissionDenied("Your role in this project cannot request capacity.")
        return project


# --- Pools and allocations -----------------------------------------------------------------------


class PoolClusterSerializer(serializers.ModelSerializer):
    """One cluster the pool holds units on, and its provisioning there."""

    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    units = serializers.IntegerField(source="units_held", read_only=True, help_text="Units held there now.")
    state = serializers.ChoiceField(
        choices=PoolClusterState.choices, read_only=True, help_text="This cluster's provisioning (PoolCluster.state)."
    )

    class Meta:
        model = PoolCluster
        fields = [
            "cluster",
            "cluster_name",
            "units",
            "state",
            "provisioned_at",
            "deprovisioned_at",
            "reconciled_at",
            "error",
        ]
        read_only_fields = fields


class GpuPoolSerializer(serializers.ModelSerializer):
    """A pool and its card: units total and in use, GPUs total and in use (shares of a GPU), GPUs touched,
    utilisation (null until monitoring provides it), allocation = profiles in use / profiles in the pool."""

    project_slug = serializers.CharField(source="project.slug", read_only=True)
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    priority_class = serializers.SerializerMethodField(
        help_text="Time-sliced and MPS pools: the Kubernetes PriorityClass for the pool's pods (from share_priority, "
        "chosen by operators); null for other pools."
    )
    clusters = PoolClusterSerializer(
        source="pool_clusters",
        many=True,
        read_only=True,
        help_text="Every cluster the pool holds units on (cluster is the home one), with its units and provisioning.",
    )
    spec = serializers.CharField(source="request.spec_label", read_only=True)
    total_gpus = serializers.SerializerMethodField(
        help_text="GPUs the pool holds, each unit counted as its share of a GPU (capacity.mig.share: a 3g.40gb of "
        "an H100 is 0.5, a time-slice replica 1 / the node's replicas), as billing charges it."
    )
    in_use_gpus = serializers.SerializerMethodField(
        help_text="The share of total_gpus whose units have a workload running on them."
    )
    gpus_touched = serializers.IntegerField(
        source="gpus_total", read_only=True, help_text="Physical GPUs the pool's units sit on, whatever their share."
    )
    gpus_touched_in_use = serializers.IntegerField(
        source="gpus_in_use", read_only=True, help_text="Physical GPUs with a unit of the pool in use."
    )
    profiles_total = serializers.IntegerField(source="units_total", read_only=True)
    profiles_in_use = serializers.IntegerField(source="units_in_use", read_only=True)
    utilisation = serializers.FloatField(read_only=True, allow_null=True, help_text="Average SM activity 0..1.")
    allocation = serializers.SerializerMethodField()
    binding = serializers.ChoiceField(
        choices=Binding.choices,
        read_only=True,
        help_text="dra: pods get exactly the pool's devices through its claim template; device-plugin: by count "
        "(quota and node selector).",
    )
    claim_template = serializers.CharField(
        read_only=True,
        allow_null=True,
        help_text="DRA: the ResourceClaimTemplate in the project's namespace that a pod references "
        "(spec.resourceClaims[].resourceClaimTemplateName) to get one of the pool's units.",
    )
    shortfall = serializers.IntegerField(
        read_only=True, help_text="Units the request asked for that the pool no longer holds (instance destroyed)."
    )
    binding_note = serializers.SerializerMethodField(
        help_text='"shared node: binding is by count" when another project holds units on one of its nodes.'
    )
    scheduling = serializers.SerializerMethodField(
        help_text="nodeSelector and affinity for the pool's pods: its pool label and its tier (gpuaas.io/tier)."
    )

    class Meta:
        model = GpuPool
        fields = [
            "id",
            "name",
            "project",
            "project_slug",
            "request",
            "cluster",
            "cluster_name",
            "clusters",
            "workload_type",
            "tier",
            "spec",
            "tags",
            "placement",
            "scheduling",
            "state",
            "state_reason",
            "total_gpus",
            "in_use_gpus",
            "gpus_touched",
            "gpus_touched_in_use",
            "utilisation",
            "profiles_total",
            "profiles_in_use",
            "allocation",
            "binding",
            "claim_template",
            "shortfall",
            "binding_note",
            "lending_enabled",
            "share_priority",
            "priority_class",
            "attempts",
            "provisioned_at",
            "created_at",
            "released_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_priority_class(self, pool: GpuPool) -> str | None:
        return pool.priority_class_name if pool.is_shared else None

    def get_allocation(self, pool: GpuPool) -> str:
        return f"{pool.units_in_use}/{pool.units_total}"

    @extend_schema_field(serializers.FloatField())
    def get_total_gpus(self, pool: GpuPool) -> float:
        return gpu_count(pool.gpu_shares()[0])

    @extend_schema_field(serializers.FloatField())
    def get_in_use_gpus(self, pool: GpuPool) -> float:
        return gpu_count(pool.gpu_shares()[1])

    def get_binding_note(self, pool: GpuPool) -> str:
        return SHARED_NODE_NOTE if getattr(pool, "shared_node", False) else ""

    @extend_schema_field(serializers.DictField())
    def get_scheduling(self, pool: GpuPool) -> dict:
        return pool.scheduling()


class AllocationSerializer(serializers.ModelSerializer):
    project_slug = serializers.CharField(source="project.slug", read_only=True)
    pool_name = serializers.CharField(source="pool.name", read_only=True)
    gpu_uuid = serializers.CharField(source="gpu.uuid", read_only=True)
    node = serializers.CharField(source="gpu.node.name", read_only=True)
    cluster = serializers.CharField(source="gpu.node.cluster.name", read_only=True)
    mig_instance_uuid = serializers.CharField(source="mig_instance.uuid", read_only=True, default=None, allow_null=True)
    # The in-app notice of an ended unit (docs/pools.md, Ending): ending until its pods are off the unit.
    state = serializers.ChoiceField(choices=AllocationState.choices, read_only=True)
    evict_after = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="While ending: when the project's pods still on it are evicted."
    )

    class Meta:
        model = Allocation
        fields = [
            "id",
            "pool",
            "pool_name",
            "project",
            "project_slug",
            "kind",
            "product",
            "profile_name",
            "resource_name",
            "cluster",
            "node",
            "gpu_uuid",
            "mig_instance_uuid",
            "replica",
            "compute_slices",
            "allocated_at",
            "released_at",
            "state",
            "end_reason",
            "evict_after",
            "vacated_at",
        ]
        read_only_fields = fields


# --- API tokens ----------------------------------------------------------------------------------


class ApiTokenSerializer(StrictModelSerializer):
    expires_in_days = serializers.IntegerField(
        write_only=True,
        required=False,
        min_value=1,
        max_value=3650,
        help_text="Alternative to expires_at. Neither: the longest life allowed, API_TOKEN_MAX_LIFETIME_DAYS "
        "(365 by default; never expires only where that is 0), and never after the token making the request.",
    )
    usable = serializers.BooleanField(source="is_usable", read_only=True)

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "key_prefix",
            "created_at",
            "expires_at",
            "expires_in_days",
            "last_used_at",
            "revoked_at",
            "usable",
        ]
        read_only_fields = ["key_prefix", "created_at", "last_used_at", "revoked_at"]

    def validate(self, attrs: dict) -> dict:
        days = attrs.pop("expires_in_days", None)
        if days is not None and attrs.get("expires_at") is not None:
            raise serializers.ValidationError({"expires_in_days": "Give expires_at or expires_in_days, not both."})
        if days is not None:
            attrs["expires_at"] = timezone.now() + dt.timedelta(days=days)
        if attrs.get("expires_at") is not None and attrs["expires_at"] <= timezone.now():
            raise serializers.ValidationError({"expires_at": "The expiry must be in the future."})
        # A token may not outlive the token that created it, nor API_TOKEN_MAX_LIFETIME_DAYS. Tokens
        # carry all of their user's rights (no scopes), so expiry is the only thing that could widen.
        parent = self._parent_token()
        limit = ApiToken.latest_expiry(parent=parent)
        if limit is not None and attrs.get("expires_at") is not None and attrs["expires_at"] > limit:
            field = "expires_in_days" if days is not None else "expires_at"
            if parent is not None and parent.expires_at == limit:
                message = f"A token made with a token cannot outlive it: expire at {limit.isoformat()} or sooner."
            else:
                days_max = settings.API_TOKEN_MAX_LIFETIME_DAYS
                message = (
                    f"Tokens live at most {days_max} days (API_TOKEN_MAX_LIFETIME_DAYS): expire by {limit.isoformat()}."
                )
            raise serializers.ValidationError({field: message})
        return attrs

    def _parent_token(self) -> ApiToken | None:
        auth = getattr(self.context.get("request"), "auth", None)
        return auth if isinstance(auth, ApiToken) else None

    def create(self, validated_data: dict) -> ApiToken:
        try:
            token, key = ApiToken.issue(
                self.context["request"].user,
                validated_data["name"],
                validated_data.get("expires_at"),
                parent=self._parent_token(),
            )
        except ValueError as refused:  # the parent was revoked (or its expiry moved) since validate()
            raise serializers.ValidationError({"non_field_errors": [str(refused)]}) from refused
        token.plain_key = key
        return token


class NewApiTokenSerializer(ApiTokenSerializer):
    key = serializers.SerializerMethodField(help_text="The token itself: shown this once, never again.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "key"]

    def get_key(self, token: ApiToken) -> str:
        return token.plain_key


class SharePrioritySerializer(StrictSerializer):
    """An operator's share priority for a time-sliced or MPS pool (docs/tiers.md, "Priorities")."""

    share_priority = serializers.ChoiceField(choices=SharePriority.choices)


class LendingSerializer(StrictSerializer):
    """Opt a pool in or out of lending its idle units (docs/queue.md, Borrowing)."""

    lending_enabled = serializers.BooleanField()


class BestEffortRequestSerializer(RequestingProjectMixin, StrictModelSerializer):
    """A standing ask for preemptible units of a spec, served from other projects' idle units (docs/queue.md).

    Never approved onto own units, never refused for shortage: it gets what idle units there are, up to
    `count`, until its project ends it or `until` passes. Name the spec as for a pinned pool request:
    an isolation kind, a tier, a product and (MIG) a profile. `units_held`: its open loans now.
    """

    project = serializers.PrimaryKeyRelatedField(queryset=Project.objects.none())
    count = UnitCountField(required=False)
    project_slug = serializers.CharField(source="project.slug", read_only=True)
    isolation = serializers.ChoiceField(
        choices=[c for c in Isolation.choices if c[0] != Isolation.VGPU], required=False, write_only=True
    )
    tier = serializers.CharField(required=False, allow_blank=True, write_only=True, max_length=32)
    cluster = serializers.PrimaryKeyRelatedField(queryset=Cluster.objects.all(), required=False, allow_null=True)
    spec = serializers.CharField(source="spec_label", read_only=True)
    requested_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    units_held = serializers.IntegerField(read_only=True, help_text="Lent units it holds now (open loans).")

    class Meta:
        model = BestEffortRequest
        fields = [
            "id",
            "project",
            "project_slug",
            "isolation",
            "tier",
            "spec_kind",
            "product",
            "profile_name",
            "spec",
            "cluster",
            "count",
            "until",
            "state",
            "units_held",
            "requested_by",
            "created_at",
            "ended_at",
            "end_reason",
        ]
        read_only_fields = ["spec_kind", "state", "created_at", "ended_at", "end_reason"]

    def validate_until(self, until: dt.datetime | None) -> dt.datetime | None:
        if until is not None and until <= timezone.now():
            raise serializers.ValidationError("The end must be in the future.")
        return until

    def validate(self, attrs: dict) -> dict:
        spec = refused_as_400(
            services.resolve_spec,
            isolation=attrs.pop("isolation", ""),
            tier=attrs.pop("tier", ""),
            product=attrs.get("product", ""),
            profile_name=attrs.get("profile_name", ""),
        )
        attrs.update(spec_kind=spec.spec_kind, product=spec.product, profile_name=spec.profile_name)
        return attrs

    def create(self, validated_data: dict) -> BestEffortRequest:
        return BestEffortRequest.objects.create(requested_by=self.context["request"].user, **validated_data)

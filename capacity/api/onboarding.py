"""Onboarding from the API: the dry-run diff and the apply of a cluster's node agent, RBAC and admission policies.

POST /api/v1/capacity/clusters/{id}/onboard/?dry_run=1 answers the diff (nothing written anywhere); POST without
dry_run applies it (capacity.services.onboarding) and answers what each object did and the audit row's id.
`force=1` takes over fields another field manager owns. Operators holding capacity.change_cluster only. A
field-manager conflict (retry with force=1 after reading it) or a registration whose kubeconfig cannot be used
answers 409; a cluster that refuses otherwise or cannot be reached 502; each with a message naming the object.
"""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from capacity.models import ClusterOnboarding, NodeCapacity
from capacity.services import onboarding

from .strict import reject_body

_FLAG = {"1": True, "true": True, "0": False, "false": False, "": False}


class FieldChangeSerializer(serializers.Serializer):
    path = serializers.CharField()
    before = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)


class ObjectChangeSerializer(serializers.Serializer):
    kind = serializers.CharField()
    namespace = serializers.CharField(allow_blank=True)
    name = serializers.CharField()
    action = serializers.ChoiceField(choices=["create", "change", "unchanged"])
    fields = FieldChangeSerializer(many=True)


class OnboardResultSerializer(serializers.Serializer):
    dry_run = serializers.BooleanField()
    onboarding = serializers.IntegerField(allow_null=True, help_text="The ClusterOnboarding row (null on a dry run).")
    objects = ObjectChangeSerializer(many=True)


class OnboardingSerializer(serializers.ModelSerializer):
    actor = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = ClusterOnboarding
        fields = ["id", "status", "actor", "force", "objects_applied", "error", "started_at", "finished_at"]
        read_only_fields = fields


class NodeAgentSerializer(serializers.ModelSerializer):
    agent_health = serializers.SerializerMethodField()

    class Meta:
        model = NodeCapacity
        fields = ["name", "agent_version", "agent_reported_at", "agent_health"]
        read_only_fields = fields

    def get_agent_health(self, node) -> str:
        return node.agent_health(self.context.get("now"))


def _flag(request, name: str) -> bool:
    raw = request.query_params.get(name, "").lower()
    if raw not in _FLAG:
        raise ValidationError({name: [f"Use 1 or 0, not {raw!r}."]})
    return _FLAG[raw]


def agents_of(cluster, now=None) -> list[dict]:
    """Each present node's agent: version, last report, health (never/stale/ok)."""
    nodes = NodeCapacity.objects.for_cluster(cluster).present().order_by("name")
    return NodeAgentSerializer(nodes, many=True, context={"now": now or timezone.now()}).data


class OnboardActionMixin:
    """The `onboard` action of the clusters viewset."""

    @extend_schema(
        summary="Install the node agent, its RBAC and the admission policies (server-side apply); dry_run=1: diff",
        parameters=[
            OpenApiParameter("dry_run", bool, description="1: answer the diff, write nothing."),
            OpenApiParameter("force", bool, description="1: take over fields another field manager owns."),
        ],
        request=None,
        responses={200: OnboardResultSerializer, 409: None, 502: None},
    )
    @action(detail=True, methods=["post"])
    def onboard(self, request, pk=None):
        cluster = self.get_object()
        reject_body(request)
        dry_run, force = _flag(request, "dry_run"), _flag(request, "force")
        try:
            if dry_run:
                changes, row = onboarding.plan_onboarding(cluster, force=force), None
            else:
                row = onboarding.onboard_cluster(cluster, actor=request.user, force=force)
                changes = row.changes
        except onboarding.OnboardingError as exc:
            conflict = exc.status == 409 or exc.credentials  # the cluster's fields, or its registration's state
            code = status.HTTP_409_CONFLICT if conflict else status.HTTP_502_BAD_GATEWAY
            return Response({"detail": str(exc)}, status=code)
        body = {"dry_run": dry_run, "onboarding": row.pk if row else None, "objects": [c.as_dict() for c in changes]}
        return Response(OnboardResultSerializer(body).data)

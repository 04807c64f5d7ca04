"""The pool requests' API with the queue in it: pools' PoolRequestViewSet plus what the queue decides.

pools.api.request_views.PoolRequestViewSet serves drafts, submissions, withdrawals, rejections and releases; this
subclass, registered at /pool-requests/ in its place (scheduling/api/urls.py), adds the actions that need the
queue or the forecast (scheduling sits above pools): the dry run with a start forecast per offer, approve
(queued instead of refused when capacity is short and the request chose to wait), the queue in order, the
forecast of a request not yet made, and the operators' hold, release, move and cancel. Each keeps its URL,
name and schema.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.decorators import action
from rest_framework.response import Response

from core.scopes import Scope
from pools.api import request_serializers, request_views
from pools.api.views import CONFLICT
from pools.models import PoolRequest

from .. import forecast, offers, queue
from ..policy import queue_policy


class PoolRequestViewSet(request_views.PoolRequestViewSet):
    def get_serializer_context(self):
        return {**super().get_serializer_context(), "queue_policy": queue_policy}  # served_by_age_from

    def queue_position(self, request: PoolRequest) -> int | None:
        return queue_policy.position_of(request)

    @extend_schema(
        summary="Dry run: the offers that meet a declaration, ranked, with prices and a start forecast",
        request=request_serializers.DryRunSerializer,
        responses={200: OpenApiResponse(description="declared, chosen, offers (ranked), rejected (with reasons)")},
    )
    @action(
        detail=False,
        methods=["post"],
        url_path="dry-run",
        filterset_class=None,
        pagination_class=None,
        scope=Scope.SIGNED_IN,
    )
    def dry_run(self, request):
        """Fleet-wide facts and list prices, no one's secret; writes nothing."""
        serializer = request_serializers.DryRunSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        return Response(offers.match_declared(**serializer.declared()).to_dict())

    @extend_schema(
        summary="Approve (operators): take units, create the pool, start provisioning; "
        "a request that chose to wait is queued when capacity is short",
        request=request_serializers.ApproveSerializer,
        responses={200: request_serializers.PoolRequestDetailSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None, scope=Scope.OPERATOR)
    def approve(self, request, pk=None):
        obj = self.get_object()
        data = self._reason(request_serializers.ApproveSerializer)
        queue.approve_or_queue(obj, actor=request.user, reason=data["reason"], cluster=data.get("cluster"))
        return Response(self._detail(obj))

    # --- The queue ---------------------------------------------------------------------------------

    @extend_schema(
        summary="The queue: my projects' waiting requests in queue order, with place and forecast",
        responses=request_serializers.PoolRequestSerializer(many=True),
    )
    @action(detail=False, methods=["get"], url_path="queue", pagination_class=None, filterset_class=None)
    def waiting(self, request):
        places = queue_policy.ordered()
        visible = {r.pk: r for r in self.get_queryset().filter(pk__in=[p.entry.request_id for p in places])}
        context = {**self.get_serializer_context(), "queue_positions": {p.entry.request_id: p.position for p in places}}
        rows = [visible[p.entry.request_id] for p in places if p.entry.request_id in visible]
        return Response(request_serializers.PoolRequestSerializer(rows, many=True, context=context).data)

    @extend_schema(
        summary='Forecast a request not yet made ("if I asked for 4 x 3g.40gb now"): P50 and P90 start',
        request=request_serializers.ForecastRequestSerializer,
        responses={200: request_serializers.ForecastSerializer},
    )
    @action(detail=False, methods=["post"], url_path="forecast", filterset_class=None)
    def forecast(self, request):
        serializer = request_serializers.ForecastRequestSerializer(
            data=request.data, context=self.get_serializer_context()
        )
        serializer.is_valid(raise_exception=True)
        values = dict(serializer.validated_data)
        values.pop("tags", None)
        estimate = forecast.estimate_start(PoolRequest(**values))
        return Response({"p50": estimate.p50, "p90": estimate.p90, "basis": estimate.basis})

    def _queue_action(self, run, serializer_class=request_serializers.ReasonSerializer) -> Response:
        obj = self.get_object()
        data = self._reason(serializer_class)
        run(obj, data)
        return Response(self._detail(obj))

    @extend_schema(
        summary="Hold a queued request (operators): it keeps its place but is skipped",
        request=request_serializers.ReasonSerializer,
        responses={200: request_serializers.PoolRequestDetailSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None, scope=Scope.OPERATOR)
    def hold(self, request, pk=None):
        return self._queue_action(lambda obj, d: queue.hold(obj, actor=request.user, reason=d["reason"]))

    @extend_schema(
        summary="Release the hold on a queued request (operators)",
        request=request_serializers.ReasonSerializer,
        responses={200: request_serializers.PoolRequestDetailSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None, scope=Scope.OPERATOR)
    def unhold(self, request, pk=None):
        return self._queue_action(lambda obj, d: queue.unhold(obj, actor=request.user, reason=d["reason"]))

    @extend_schema(
        summary="Move a queued request to a place in the queue (operators)",
        request=request_serializers.MoveSerializer,
        responses={200: request_serializers.PoolRequestDetailSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None, scope=Scope.OPERATOR)
    def move(self, request, pk=None):
        return self._queue_action(
            lambda obj, d: queue.move(obj, position=d["position"], actor=request.user, reason=d["reason"]),
            request_serializers.MoveSerializer,
        )

    @extend_schema(
        summary="Cancel a queued request (operators), with a reason",
        request=request_serializers.RejectSerializer,
        responses={200: request_serializers.PoolRequestDetailSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"], filterset_class=None, scope=Scope.OPERATOR)
    def cancel(self, request, pk=None):
        return self._queue_action(
            lambda obj, d: queue.cancel(obj, actor=request.user, reason=d["reason"]),
            request_serializers.RejectSerializer,
        )

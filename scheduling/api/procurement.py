"""GET /api/v1/procurement/what-if/: the procurement what-if (scheduling/procurement.py), for operators.

`?product=H100-80GB&tier=full&add=0,32,64` answers, for each GPU count added, the mean and P90 wait and the
utilisation over the demand of the last `window_days`, beside what was observed and the assumptions. The
admin's page (scheduling/admin.py) reads its input through the same WhatIfQuery.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from capacity.api.fields import CatalogProductField
from core.api import QuerySerializer
from core.scopes import Scope

from .. import procurement

MAX_ADDS = 10
MAX_ADD_GPUS = 4096
ADD_PATTERN = r"^\d{1,4}(,\d{1,4}){0,9}$"


class WhatIfQuery(QuerySerializer):
    product = CatalogProductField(help_text="GPU product (catalog key).")
    tier = serializers.ChoiceField(
        choices=list(procurement.TIER_KINDS),
        help_text="1 and 2: MIG (name the profile); 3: time-slicing; full: whole GPUs.",
    )
    profile = serializers.CharField(
        required=False, max_length=32, help_text="MIG profile, e.g. 3g.40gb: tiers 1 and 2 only."
    )
    add = serializers.RegexField(
        ADD_PATTERN,
        required=False,
        default="0,32,64",
        help_text=f"GPU counts to add, comma-separated: up to {MAX_ADDS}, each 0 to {MAX_ADD_GPUS}.",
    )
    window_days = serializers.IntegerField(
        required=False, default=30, min_value=1, max_value=365, help_text="Demand history: the last N days."
    )
    seed = serializers.IntegerField(required=False, min_value=0, max_value=2**31 - 1)

    def validate_add(self, value: str) -> list[int]:
        adds = [int(part) for part in value.split(",")]
        if any(n > MAX_ADD_GPUS for n in adds):
            raise serializers.ValidationError(f"Each count is at most {MAX_ADD_GPUS} GPUs.")
        if len(set(adds)) != len(adds):
            raise serializers.ValidationError("Give each count once.")
        return adds

    def validate(self, attrs):
        try:
            attrs["spec"] = procurement.spec_for(attrs["product"], attrs["tier"], attrs.get("profile", ""))
        except procurement.WhatIfError as exc:
            raise serializers.ValidationError(exc.errors) from None
        return attrs

    def answer(self) -> dict:
        data = self.validated_data
        return procurement.what_if(
            data["product"],
            data["tier"],
            data["add"],
            profile=data.get("profile", ""),
            window_days=data["window_days"],
            seed=data.get("seed"),
        )


class WaitsSerializer(serializers.Serializer):
    mean_wait_h = serializers.FloatField()
    p90_wait_h = serializers.FloatField()
    utilisation = serializers.FloatField(allow_null=True, help_text="Slot-hours reserved over slot-hours there.")
    started = serializers.IntegerField()
    still_waiting = serializers.IntegerField()


class AnswerSerializer(WaitsSerializer):
    add_gpus = serializers.IntegerField()
    add_slots = serializers.IntegerField(help_text="The slots those GPUs give (the seed's arithmetic).")
    slots = serializers.IntegerField(help_text="Slots of the spec with them.")


class WindowSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    days = serializers.IntegerField()


class UnitSerializer(serializers.Serializer):
    slots_per_gpu = serializers.IntegerField()
    kind = serializers.CharField()
    arithmetic = serializers.DictField(help_text="capacity_plan for one GPU of the product in the tier.")


class WhatIfSerializer(serializers.Serializer):
    product = serializers.CharField()
    tier = serializers.CharField()
    profile = serializers.CharField()
    window = WindowSerializer()
    unit = UnitSerializer()
    slots_now = serializers.IntegerField()
    requests = serializers.IntegerField(help_text="Requests of the window replayed (approved or queued).")
    observed = WaitsSerializer()
    answers = AnswerSerializer(many=True)
    draws = serializers.IntegerField()
    seed = serializers.IntegerField()
    assumptions = serializers.ListField(child=serializers.CharField())


class WhatIfView(APIView):
    """With N more GPUs of a product in a tier, what the queue's waits and utilisation would have been."""

    scope = Scope.OPERATOR
    operator_perms = {"get": ("pools.view_poolrequest",)}

    @extend_schema(
        summary="Procurement what-if: waits and utilisation with N more GPUs",
        parameters=[WhatIfQuery],
        responses=WhatIfSerializer,
    )
    def get(self, request):
        query = WhatIfQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(WhatIfSerializer(query.answer()).data)

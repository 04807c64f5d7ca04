"""Non-API pages of the monitoring app: /metrics for Prometheus."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from tenancy.roles import operator_can

from .exposition import exposition

METRICS_PERMISSION = "monitoring.view_series"


def _allowed(request: HttpRequest) -> bool:
    """Bearer MONITORING_METRICS_TOKEN when set, or an operator holding monitoring.view_series. DEBUG opens nothing."""
    token = settings.MONITORING_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header.removeprefix("Bearer ").strip(), token)
    return operator_can(request.user, METRICS_PERMISSION)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition of pool, project and health gauges (monitoring/exposition.py)."""
    if not _allowed(request):
        response = HttpResponse("authentication required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="gpuaas metrics"'
        return response
    body, content_type = exposition()
    return HttpResponse(body, content_type=content_type)

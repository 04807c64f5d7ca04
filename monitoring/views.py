"""Non-API pages of the monitoring app: /metrics for Prometheus."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from core.scopes import Scope, scoped

from .exposition import exposition

METRICS_PERMISSION = "monitoring.view_series"


def _scrape_token(request: HttpRequest) -> bool | None:
    """Whether the Bearer token is MONITORING_METRICS_TOKEN; None when none is set or presented. DEBUG opens nothing."""
    token = settings.MONITORING_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if not (token and header.startswith("Bearer ")):
        return None
    return hmac.compare_digest(header.removeprefix("Bearer ").strip(), token)


def _ask_for_credentials(request: HttpRequest) -> HttpResponse:
    """A scraper understands 401 + WWW-Authenticate, not the admin's 403 page."""
    response = HttpResponse("authentication required\n", status=401, content_type="text/plain")
    response["WWW-Authenticate"] = 'Bearer realm="gpuaas metrics"'
    return response


@require_GET
@scoped(Scope.OPERATOR, METRICS_PERMISSION, credential=_scrape_token, refused=_ask_for_credentials)
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition of pool, project and health gauges (monitoring/exposition.py).

    For the scrape token (MONITORING_METRICS_TOKEN) or an operator holding monitoring.view_series.
    """
    body, content_type = exposition()
    return HttpResponse(body, content_type=content_type)

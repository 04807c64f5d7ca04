"""The adapter's errors: every failure is a KubernetesError, never a kubernetes.* or urllib3 exception."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException


class KubernetesError(Exception):
    """Any failure talking to a cluster. `status` is the HTTP status (None: no response)."""

    def __init__(self, message: str, *, status: int | None = None, reason: str = ""):
        super().__init__(message)
        self.status = status
        self.reason = reason


class ConfigError(KubernetesError):
    """The kubeconfig (or in-cluster service account) cannot be read or has no such context."""


class Unavailable(KubernetesError):
    """The API server did not answer usefully after the retries: 5xx, 429, timeouts, connection errors."""


class TooManyRequests(Unavailable):
    """429. From the eviction API it means a PodDisruptionBudget blocks the eviction right now."""


class NotFound(KubernetesError):
    """404: the object (or its namespace) does not exist."""


class Conflict(KubernetesError):
    """409: the object already exists, or the resourceVersion given is stale."""


class Forbidden(KubernetesError):
    """401/403: the credentials are not accepted or lack the permission."""


class Invalid(KubernetesError):
    """400/422: the request was rejected as malformed or invalid."""


class Expired(KubernetesError):
    """410: a continue token (or resourceVersion) is too old."""


def error_for(status: int, message: str, reason: str = "") -> KubernetesError:
    """The error class for an HTTP status."""
    cls: type[KubernetesError]
    if status == 404:
        cls = NotFound
    elif status == 409:
        cls = Conflict
    elif status in (401, 403):
        cls = Forbidden
    elif status in (400, 422):
        cls = Invalid
    elif status == 410:
        cls = Expired
    elif status == 429:
        cls = TooManyRequests
    elif status >= 500:
        cls = Unavailable
    else:
        cls = KubernetesError
    return cls(message, status=status, reason=reason)


def api_exception_message(exc: ApiException) -> str:
    """The Status message from the body when there is one, else HTTP reason."""
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if body:
        try:
            status = json.loads(body)
            if isinstance(status, dict) and status.get("message"):
                return f"{exc.status} {status.get('reason') or exc.reason}: {status['message']}"
        except ValueError:
            pass
        return f"{exc.status} {exc.reason}: {body[:200]}"
    return f"{exc.status} {exc.reason}"


def retry_after_s(exc: ApiException) -> float | None:
    """The Retry-After header in seconds; None when absent or not a number."""
    headers = exc.headers or {}
    raw = headers.get("Retry-After") or headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return None  # an HTTP date: rare from the API server; fall back to backoff

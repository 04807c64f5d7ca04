"""The client's transport: one ApiClient per cluster, every call with a timeout, retries and paging.

Retries (settings.KUBERNETES_RETRIES) on 429 (honouring Retry-After), 5xx, timeouts and connection
errors, with exponential backoff and jitter, through tenacity (the policy is ours: what is retried, and
how long to wait; the loop, stop and sleep are the library's). Responses are read with `_preload_content=False` and
parsed as JSON here (the client's model deserialisation costs more than the HTTP). A failure on any
page fails the whole list; an expired continue token (410) restarts the list once.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from typing import Self

import tenacity
import urllib3
from django.conf import settings
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException, ApiValueError

from .errors import (
    Expired,
    Invalid,
    KubernetesError,
    Unavailable,
    api_exception_message,
    error_for,
    retry_after_s,
)

logger = logging.getLogger(__name__)

RETRY_AFTER_MAX_S = 30.0
BACKOFF_BASE_S = 0.25
BACKOFF_CAP_S = 8.0
MERGE_PATCH = "application/merge-patch+json"
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# Names gpuaas in the API server's audit log and in the simulator's request log (simcluster/rbac.py).
USER_AGENT = "gpuaas"
# Onboarding's requests: made with an administrator's credentials (they create RBAC), not gpuaas-controller's,
# so they are told apart in the audit log and are not held against deploy/clusterrole.yaml (tests/conftest.py).
ONBOARDING_USER_AGENT = "gpuaas-onboarding"


def backoff_sleep(seconds: float) -> None:
    """How the client waits between retries (tests replace it to record the waits)."""
    time.sleep(seconds)


class _Retryable(Exception):
    """A failure worth another try (429, 5xx, timeouts, connection errors): `error` is raised if none is left."""

    def __init__(self, error: KubernetesError, retry_after: float | None = None):
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


class Transport:
    """The connection to one cluster's API server and the retrying, paging call every request goes through.

    Use as a context manager (or call close()) so the connection pool is released.
    """

    def __init__(
        self,
        configuration: k8s.Configuration,
        *,
        timeout_s: float | None = None,
        retries: int | None = None,
        page_size: int | None = None,
        sleep: Callable[[float], None] | None = None,
        user_agent: str = USER_AGENT,
    ):
        self.api_client = k8s.ApiClient(configuration)
        self.api_client.user_agent = user_agent
        self.core = k8s.CoreV1Api(self.api_client)
        self.host = configuration.host
        timeout = float(timeout_s if timeout_s is not None else settings.KUBERNETES_TIMEOUT_S)
        self.timeout = (timeout, timeout)
        self.retries = int(retries if retries is not None else settings.KUBERNETES_RETRIES)
        self.page_size = int(page_size or settings.KUBERNETES_PAGE_SIZE)
        self.sleep = sleep or backoff_sleep

    def close(self) -> None:
        self.api_client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _wait(self, state: tenacity.RetryCallState) -> float:
        """The server's Retry-After where it gave one, else exponential backoff with jitter."""
        retry_after = state.outcome.exception().retry_after
        if retry_after is not None:
            return retry_after
        return min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (state.attempt_number - 1)) * (0.5 + random.random() / 2)

    def _call(self, method: Callable, *args, retry_429: bool = True, **kwargs) -> dict:
        """Call one generated CoreV1Api method with retries (tenacity); the response body parsed as JSON."""
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.retries + 1),
            wait=self._wait,
            retry=tenacity.retry_if_exception_type(_Retryable),
            sleep=self.sleep,
            before_sleep=lambda state: logger.info(
                "%s; retry %d/%d in %.2f s",
                state.outcome.exception().error,
                state.attempt_number,
                self.retries,
                state.upcoming_sleep,
            ),
            reraise=True,
        )
        try:
            return retrying(self._attempt, method, args, kwargs, retry_429)
        except _Retryable as exc:
            raise exc.error from None

    def _attempt(self, method: Callable, args: tuple, kwargs: dict, retry_429: bool) -> dict:
        """One call: the parsed body, a KubernetesError that no retry would mend, or _Retryable."""
        what = method.__name__
        try:
            response = method(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
            try:
                data = response.data
            finally:
                response.release_conn()
            return json.loads(data) if data else {}
        except ApiException as exc:
            status = exc.status or 0
            message = f"{what} on {self.host}: {api_exception_message(exc)}"
            if status == 0:  # the client's own wrapper around transport errors (TLS)
                raise _Retryable(Unavailable(message, status=None, reason=str(exc.reason))) from None
            if status not in _RETRY_STATUSES or (status == 429 and not retry_429):
                raise error_for(status, message, str(exc.reason or "")) from None
            retry_after = retry_after_s(exc) if status in (429, 503) else None
            if retry_after is not None and retry_after > RETRY_AFTER_MAX_S:
                raise Unavailable(
                    f"{message} (Retry-After {retry_after:g} s is longer than {RETRY_AFTER_MAX_S:g} s)", status=status
                ) from None
            raise _Retryable(error_for(status, message, str(exc.reason or "")), retry_after) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            # NewConnectionError subclasses ConnectTimeoutError in urllib3: test it first.
            timed_out = isinstance(exc, urllib3.exceptions.TimeoutError) and not isinstance(
                exc, urllib3.exceptions.NewConnectionError
            )
            kind = "timed out" if timed_out else "connection failed"
            raise _Retryable(Unavailable(f"{what} on {self.host}: {kind}: {exc}")) from None
        except ValueError as exc:  # unparseable JSON or ApiValueError
            if isinstance(exc, ApiValueError):
                raise Invalid(f"{what}: {exc}") from None
            raise _Retryable(Unavailable(f"{what} on {self.host}: response is not JSON: {exc}")) from None

    def _list(self, method: Callable, *args, **kwargs) -> list[dict]:
        """Every item of a paged list; any failure fails the whole list, 410 restarts it once."""
        restarted = False
        while True:
            items: list[dict] = []
            token: str | None = None
            try:
                while True:
                    page_kwargs = dict(kwargs, limit=self.page_size)
                    if token:
                        page_kwargs["_continue"] = token
                    page = self._call(method, *args, **page_kwargs)
                    items.extend(page.get("items") or ())
                    token = (page.get("metadata") or {}).get("continue") or None
                    if not token:
                        return items
            except Expired:
                if token is None or restarted:
                    raise
                restarted = True
                logger.info(
                    "%s: continue token expired after %d items; restarting the list", method.__name__, len(items)
                )

"""The Kubernetes adapter: the only module of the apps that imports the `kubernetes` package.

One `KubernetesClient` per cluster, each with its own `ApiClient` and `Configuration` (the
client's global default configuration is never read or written), built from a kubeconfig file,
an (already decrypted) kubeconfig text, or the pod's in-cluster service account.

Every call:
- has a timeout (settings.KUBERNETES_TIMEOUT_S, connect and read);
- is retried up to settings.KUBERNETES_RETRIES times on 429 (honouring Retry-After), 5xx,
  timeouts and connection errors, with exponential backoff and jitter;
- reads the response with `_preload_content=False` and parses the JSON itself into small
  dataclasses or plain dicts (the client's model deserialisation costs more than the HTTP);
- raises only `KubernetesError` and its subclasses, never kubernetes.* or urllib3 exceptions.

Lists are paged (limit/continue, settings.KUBERNETES_PAGE_SIZE). A failure on any page fails the
whole list: a partial list is never returned as if complete. An expired continue token (410)
restarts the list from the beginning once.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml
from django.conf import settings
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException, ApiValueError
from kubernetes.config.config_exception import ConfigException

logger = logging.getLogger(__name__)

NODE_SELECTOR_ANNOTATION = "scheduler.alpha.kubernetes.io/node-selector"
RETRY_AFTER_MAX_S = 30.0
BACKOFF_BASE_S = 0.25
BACKOFF_CAP_S = 8.0
MERGE_PATCH = "application/merge-patch+json"
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


def backoff_sleep(seconds: float) -> None:
    """How the client waits between retries (tests replace it to record the waits)."""
    time.sleep(seconds)


# --- Errors ---------------------------------------------------------------------------------


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


def _error_for(status: int, message: str, reason: str = "") -> KubernetesError:
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


def _api_exception_message(exc: ApiException) -> str:
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


def _retry_after_s(exc: ApiException) -> float | None:
    headers = exc.headers or {}
    raw = headers.get("Retry-After") or headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return None  # an HTTP date: rare from the API server; fall back to backoff


# --- Parsed objects -------------------------------------------------------------------------


@dataclass(slots=True)
class Node:
    """The parts of a v1 Node that gpuaas reads."""

    name: str
    uid: str
    resource_version: str
    labels: dict[str, str]
    annotations: dict[str, str]
    capacity: dict[str, str]
    allocatable: dict[str, str]
    unschedulable: bool
    ready: bool
    taints: list[dict] = field(default_factory=list)


@dataclass(slots=True)
class Pod:
    """The parts of a v1 Pod that gpuaas reads. `requests` holds extended resources only, as ints."""

    namespace: str
    name: str
    uid: str
    node_name: str
    phase: str
    labels: dict[str, str]
    annotations: dict[str, str]
    requests: dict[str, int]
    start_time: str | None
    deleted: bool

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def parse_node(obj: dict) -> Node:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ready = False
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
            break
    return Node(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        resource_version=meta.get("resourceVersion", ""),
        labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {},
        capacity=status.get("capacity") or {},
        allocatable=status.get("allocatable") or {},
        unschedulable=bool(spec.get("unschedulable")),
        ready=ready,
        taints=spec.get("taints") or [],
    )


def _extended(resources: dict | None) -> dict[str, int]:
    """Extended resources (names with a '/') as integers; cpu/memory quantities are skipped."""
    out: dict[str, int] = {}
    for name, value in (resources or {}).items():
        if "/" in name:
            try:
                out[name] = int(value)
            except (TypeError, ValueError):
                continue
    return out


def pod_extended_requests(spec: dict) -> dict[str, int]:
    """Effective extended-resource request of a pod: max(sum over containers, any init container).

    A limit stands in for a missing request, as the API server defaults requests to limits.
    """

    def wanted(container: dict) -> dict[str, int]:
        res = container.get("resources") or {}
        return _extended({**(res.get("limits") or {}), **(res.get("requests") or {})})

    total: dict[str, int] = {}
    for container in spec.get("containers") or ():
        for name, count in wanted(container).items():
            total[name] = total.get(name, 0) + count
    for container in spec.get("initContainers") or ():
        for name, count in wanted(container).items():
            total[name] = max(total.get(name, 0), count)
    return total


def parse_pod(obj: dict) -> Pod:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return Pod(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        node_name=spec.get("nodeName") or "",
        phase=status.get("phase") or "Pending",
        labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {},
        requests=pod_extended_requests(spec),
        start_time=status.get("startTime"),
        deleted=bool(meta.get("deletionTimestamp")),
    )


# --- Configuration --------------------------------------------------------------------------


def _fresh_configuration() -> k8s.Configuration:
    # Configuration() copies the process-wide default; type.__call__ builds a pristine one.
    return type.__call__(k8s.Configuration)


def load_configuration(
    *,
    kubeconfig_path: str = "",
    kubeconfig_text: str | None = None,
    context: str = "",
    in_cluster: bool = False,
) -> k8s.Configuration:
    """A Configuration of its own for one cluster; raises ConfigError naming what is wrong."""
    cfg = _fresh_configuration()
    try:
        if in_cluster:
            k8s_config.load_incluster_config(client_configuration=cfg)
        elif kubeconfig_text:
            data = yaml.safe_load(kubeconfig_text)
            if not isinstance(data, dict):
                raise ConfigError("the stored kubeconfig is not a YAML mapping")
            k8s_config.load_kube_config_from_dict(
                data, context=context or None, client_configuration=cfg, persist_config=False
            )
        elif kubeconfig_path:
            path = Path(kubeconfig_path).expanduser()
            if not path.is_file():
                raise ConfigError(f"kubeconfig {path} does not exist")
            k8s_config.load_kube_config(
                config_file=str(path), context=context or None, client_configuration=cfg, persist_config=False
            )
        else:
            raise ConfigError("no kubeconfig path, kubeconfig text or in-cluster configuration given")
    except ConfigError:
        raise
    except (ConfigException, yaml.YAMLError, OSError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"cannot load kubeconfig: {exc}") from None
    # Retries are ours (below), so urllib3 must not retry underneath.
    cfg.retries = False
    return cfg


def configuration_for(cluster) -> k8s.Configuration:
    """The Configuration of a capacity.Cluster row: in-cluster, stored kubeconfig, or kubeconfig path."""
    try:
        text = None if cluster.in_cluster else cluster.kubeconfig_text()
    except ValueError as exc:  # undecryptable stored credentials
        raise ConfigError(str(exc)) from None
    return load_configuration(
        kubeconfig_path=cluster.kubeconfig_path,
        kubeconfig_text=text,
        context=cluster.kubeconfig_context,
        in_cluster=cluster.in_cluster,
    )


def api_url_for(cluster) -> str:
    """The cluster's API server URL from its credentials, else the informational api_endpoint."""
    try:
        return configuration_for(cluster).host
    except ConfigError:
        return cluster.api_endpoint


def kubeconfig_contexts(path: str) -> tuple[list[str], str]:
    """(context names, current context) of a kubeconfig file; ConfigError if unreadable."""
    try:
        contexts, current = k8s_config.list_kube_config_contexts(config_file=str(Path(path).expanduser()))
    except (ConfigException, yaml.YAMLError, OSError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"cannot read kubeconfig {path}: {exc}") from None
    return [c["name"] for c in contexts], (current or {}).get("name", "")


# --- The client -----------------------------------------------------------------------------


class KubernetesClient:
    """One cluster's API: reads return parsed dataclasses, writes return the object as a dict.

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
    ):
        self.api_client = k8s.ApiClient(configuration)
        self.core = k8s.CoreV1Api(self.api_client)
        self.host = configuration.host
        timeout = float(timeout_s if timeout_s is not None else settings.KUBERNETES_TIMEOUT_S)
        self.timeout = (timeout, timeout)
        self.retries = int(retries if retries is not None else settings.KUBERNETES_RETRIES)
        self.page_size = int(page_size or settings.KUBERNETES_PAGE_SIZE)
        self.sleep = sleep or backoff_sleep

    @classmethod
    def from_kubeconfig(cls, path: str, context: str = "", **kwargs) -> KubernetesClient:
        return cls(load_configuration(kubeconfig_path=path, context=context), **kwargs)

    @classmethod
    def for_cluster(cls, cluster, **kwargs) -> KubernetesClient:
        """The client for a capacity.Cluster row: in-cluster, stored kubeconfig, or kubeconfig path."""
        return cls(configuration_for(cluster), **kwargs)

    def close(self) -> None:
        self.api_client.close()

    def __enter__(self) -> KubernetesClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # --- transport ----------------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        return min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt) * (0.5 + random.random() / 2)

    def _call(self, method: Callable, *args, retry_429: bool = True, **kwargs) -> dict:
        """Call one generated CoreV1Api method with retries; the response body parsed as JSON."""
        what = method.__name__
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = method(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
                try:
                    data = response.data
                finally:
                    response.release_conn()
                return json.loads(data) if data else {}
            except ApiException as exc:
                status = exc.status or 0
                message = f"{what} on {self.host}: {_api_exception_message(exc)}"
                if status == 0:  # the client's own wrapper around transport errors (TLS)
                    error: KubernetesError = Unavailable(message, status=None, reason=str(exc.reason))
                    delay = self._backoff(attempt)
                elif status in _RETRY_STATUSES and (status != 429 or retry_429):
                    error = _error_for(status, message, str(exc.reason or ""))
                    retry_after = _retry_after_s(exc) if status in (429, 503) else None
                    if retry_after is not None and retry_after > RETRY_AFTER_MAX_S:
                        raise Unavailable(
                            f"{message} (Retry-After {retry_after:g} s is longer than {RETRY_AFTER_MAX_S:g} s)",
                            status=status,
                        ) from None
                    delay = retry_after if retry_after is not None else self._backoff(attempt)
                else:
                    raise _error_for(status, message, str(exc.reason or "")) from None
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                # NewConnectionError subclasses ConnectTimeoutError in urllib3: test it first.
                timed_out = isinstance(exc, urllib3.exceptions.TimeoutError) and not isinstance(
                    exc, urllib3.exceptions.NewConnectionError
                )
                kind = "timed out" if timed_out else "connection failed"
                error = Unavailable(f"{what} on {self.host}: {kind}: {exc}")
                delay = self._backoff(attempt)
            except ValueError as exc:  # unparseable JSON or ApiValueError
                if isinstance(exc, ApiValueError):
                    raise Invalid(f"{what}: {exc}") from None
                error = Unavailable(f"{what} on {self.host}: response is not JSON: {exc}")
                delay = self._backoff(attempt)
            if last:
                raise error
            logger.info("%s; retry %d/%d in %.2f s", error, attempt + 1, self.retries, delay)
            self.sleep(delay)
        raise AssertionError("unreachable")

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

    # --- nodes --------------------------------------------------------------------------

    def list_nodes(self, label_selector: str = "") -> list[Node]:
        kwargs = {"label_selector": label_selector} if label_selector else {}
        return [parse_node(obj) for obj in self._list(self.core.list_node, **kwargs)]

    def get_node(self, name: str) -> Node:
        return parse_node(self._call(self.core.read_node, name))

    def patch_node(self, name: str, body: dict) -> Node:
        """JSON merge patch of a node (a None value removes a key)."""
        return parse_node(self._call(self.core.patch_node, name, body, _content_type=MERGE_PATCH))

    def patch_node_labels(self, name: str, labels: dict[str, str | None]) -> Node:
        """Set labels; a None value removes that label."""
        return self.patch_node(name, {"metadata": {"labels": labels}})

    def patch_node_annotations(self, name: str, annotations: dict[str, str | None]) -> Node:
        return self.patch_node(name, {"metadata": {"annotations": annotations}})

    def cordon(self, name: str) -> Node:
        return self.patch_node(name, {"spec": {"unschedulable": True}})

    def uncordon(self, name: str) -> Node:
        return self.patch_node(name, {"spec": {"unschedulable": None}})

    # --- pods ---------------------------------------------------------------------------

    def list_pods(self, namespace: str = "", *, label_selector: str = "", field_selector: str = "") -> list[Pod]:
        """Pods of one namespace, or of all namespaces when namespace is empty."""
        kwargs = {}
        if label_selector:
            kwargs["label_selector"] = label_selector
        if field_selector:
            kwargs["field_selector"] = field_selector
        if namespace:
            items = self._list(self.core.list_namespaced_pod, namespace, **kwargs)
        else:
            items = self._list(self.core.list_pod_for_all_namespaces, **kwargs)
        return [parse_pod(obj) for obj in items]

    def list_pods_on_node(self, node_name: str, namespace: str = "", *, label_selector: str = "") -> list[Pod]:
        return self.list_pods(namespace, label_selector=label_selector, field_selector=f"spec.nodeName={node_name}")

    def get_pod(self, namespace: str, name: str) -> Pod:
        return parse_pod(self._call(self.core.read_namespaced_pod, name, namespace))

    def evict_pod(self, namespace: str, name: str, *, grace_period_s: int | None = None) -> None:
        """Evict through the policy/v1 Eviction API, honouring PodDisruptionBudgets.

        A 429 is not retried here: it means a budget blocks the eviction now (TooManyRequests).
        """
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if grace_period_s is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_period_s}
        self._call(self.core.create_namespaced_pod_eviction, name, namespace, body, retry_429=False)

    def delete_pod(self, namespace: str, name: str, *, grace_period_s: int | None = None) -> None:
        kwargs = {} if grace_period_s is None else {"grace_period_seconds": grace_period_s}
        self._call(self.core.delete_namespaced_pod, name, namespace, **kwargs)

    # --- configmaps ---------------------------------------------------------------------

    def get_config_map(self, namespace: str, name: str) -> dict:
        return self._call(self.core.read_namespaced_config_map, name, namespace)

    def create_config_map(
        self, namespace: str, name: str, data: dict[str, str], *, labels: dict[str, str] | None = None
    ) -> dict:
        body = _object("ConfigMap", namespace, name, labels=labels)
        body["data"] = data
        return self._call(self.core.create_namespaced_config_map, namespace, body)

    def replace_config_map(
        self,
        namespace: str,
        name: str,
        data: dict[str, str],
        *,
        labels: dict[str, str] | None = None,
        resource_version: str = "",
    ) -> dict:
        """Replace; with resource_version the write fails with Conflict if someone changed it since."""
        body = _object("ConfigMap", namespace, name, labels=labels, resource_version=resource_version)
        body["data"] = data
        return self._call(self.core.replace_namespaced_config_map, name, namespace, body)

    def patch_config_map(
        self,
        namespace: str,
        name: str,
        *,
        data: dict[str, str | None] | None = None,
        labels: dict[str, str | None] | None = None,
        annotations: dict[str, str | None] | None = None,
    ) -> dict:
        """Merge-patch keys of data/labels/annotations; a None value removes the key."""
        body: dict[str, Any] = {}
        if data is not None:
            body["data"] = data
        meta = {k: v for k, v in (("labels", labels), ("annotations", annotations)) if v is not None}
        if meta:
            body["metadata"] = meta
        return self._call(self.core.patch_namespaced_config_map, name, namespace, body, _content_type=MERGE_PATCH)

    def apply_config_map(
        self, namespace: str, name: str, data: dict[str, str], *, labels: dict[str, str] | None = None
    ) -> dict:
        """Create the ConfigMap, or replace its data and labels when it exists (idempotent)."""
        try:
            return self.create_config_map(namespace, name, data, labels=labels)
        except Conflict:
            return self.replace_config_map(namespace, name, data, labels=labels)

    def delete_config_map(self, namespace: str, name: str) -> None:
        self._call(self.core.delete_namespaced_config_map, name, namespace)

    # --- resource quotas ----------------------------------------------------------------

    def get_resource_quota(self, namespace: str, name: str) -> dict:
        return self._call(self.core.read_namespaced_resource_quota, name, namespace)

    def create_resource_quota(
        self, namespace: str, name: str, hard: dict[str, str], *, labels: dict[str, str] | None = None
    ) -> dict:
        body = _object("ResourceQuota", namespace, name, labels=labels)
        body["spec"] = {"hard": {k: str(v) for k, v in hard.items()}}
        return self._call(self.core.create_namespaced_resource_quota, namespace, body)

    def replace_resource_quota(
        self,
        namespace: str,
        name: str,
        hard: dict[str, str],
        *,
        labels: dict[str, str] | None = None,
        resource_version: str = "",
    ) -> dict:
        body = _object("ResourceQuota", namespace, name, labels=labels, resource_version=resource_version)
        body["spec"] = {"hard": {k: str(v) for k, v in hard.items()}}
        return self._call(self.core.replace_namespaced_resource_quota, name, namespace, body)

    def apply_resource_quota(
        self, namespace: str, name: str, hard: dict[str, str], *, labels: dict[str, str] | None = None
    ) -> dict:
        """Create the quota, or replace its hard limits when it exists (idempotent)."""
        try:
            return self.create_resource_quota(namespace, name, hard, labels=labels)
        except Conflict:
            return self.replace_resource_quota(namespace, name, hard, labels=labels)

    def delete_resource_quota(self, namespace: str, name: str) -> None:
        self._call(self.core.delete_namespaced_resource_quota, name, namespace)

    # --- namespaces ---------------------------------------------------------------------

    def get_namespace(self, name: str) -> dict:
        return self._call(self.core.read_namespace, name)

    def create_namespace(
        self,
        name: str,
        *,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        node_selector: str | None = None,
    ) -> dict:
        """Create a namespace; node_selector sets scheduler.alpha.kubernetes.io/node-selector."""
        annotations = dict(annotations or {})
        if node_selector is not None:
            annotations[NODE_SELECTOR_ANNOTATION] = node_selector
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        if labels:
            body["metadata"]["labels"] = labels
        if annotations:
            body["metadata"]["annotations"] = annotations
        return self._call(self.core.create_namespace, body)

    def patch_namespace(
        self,
        name: str,
        *,
        labels: dict[str, str | None] | None = None,
        annotations: dict[str, str | None] | None = None,
        node_selector: str | None = None,
    ) -> dict:
        """Merge-patch labels/annotations (a None value removes the key); node_selector sets the
        scheduler.alpha.kubernetes.io/node-selector annotation when given."""
        annotations = dict(annotations or {})
        if node_selector is not None:
            annotations[NODE_SELECTOR_ANNOTATION] = node_selector
        meta: dict[str, Any] = {}
        if labels:
            meta["labels"] = labels
        if annotations:
            meta["annotations"] = annotations
        return self._call(self.core.patch_namespace, name, {"metadata": meta}, _content_type=MERGE_PATCH)

    def ensure_namespace(
        self,
        name: str,
        *,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        node_selector: str | None = None,
    ) -> dict:
        """Create the namespace, or merge the labels/annotations into the existing one (idempotent)."""
        try:
            return self.create_namespace(name, labels=labels, annotations=annotations, node_selector=node_selector)
        except Conflict:
            return self.patch_namespace(name, labels=labels, annotations=annotations, node_selector=node_selector)


def _object(kind: str, namespace: str, name: str, *, labels=None, resource_version: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = labels
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": "v1", "kind": kind, "metadata": meta}

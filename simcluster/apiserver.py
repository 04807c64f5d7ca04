"""A fake kube-apiserver (plus simulator endpoints) over plain HTTP.

The official `kubernetes` client talks to it unchanged through a kubeconfig. One server
serves every cluster of a SimState, each under its own path prefix:

    http://HOST:PORT/clusters/<cluster>/api/v1/nodes ...   (kubeconfig server: .../clusters/<cluster>)
    http://HOST:PORT/api/v1/nodes ...                      (the first cluster, for convenience)

Simulator endpoints live beside the API under the same prefix:

    GET  /version, /api, /apis, /api/v1    discovery, as a real server answers it
    GET  /openapi/v2, /openapi/v3[/<gv>]   OpenAPI documents of the served kinds (simcluster/openapi.py)
    /apis/kubevirt.io/v1/...virtualmachineinstances   KubeVirt VMIs (simcluster/kubevirt.py)
    /apis/kubevirt.io/v1/...kubevirts                  the KubeVirt CR (simcluster/kubevirt_cr.py)
    GET  ...?watch=true                    JSON-line watch events (BOOKMARK, 410 Gone), see docs/simcluster.md
    GET  /sim/v1/info                      clusters, nodes, sim time
    GET  /sim/v1/faults | POST | DELETE    list / inject (`{"fault": ...}`) / reset faults
    POST /sim/v1/tick                      {"seconds": 1.0, "mig_manager": false}
    GET  /sim/v1/nodes/<node>              the simulator's view of a node (devices, MIG manager)
    GET  /sim/v1/nodes/<node>/nvml         NVML snapshot; POST {"op": ..., "args": {...}} for writes
    GET  /sim/v1/nodes/<node>/history      ?seconds=&step=: past activity from the same model (demo seeding)
    GET  /sim/v1/nodes/<node>/dcgm         the node's dcgm-exporter /metrics text (simcluster/dcgm.py)
                                           and {"op": "events", ...} to long-poll NVML events

A background thread runs due MIG-manager jobs (every 50 ms) and, when `tick_interval` is
set, advances simulated time with the wall clock (metrics move).
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from . import dcgm, dra, driver, fieldmanager, kube, kubevirt, kubevirt_cr, nvml, openapi, podresources, rbac
from .kubeconfig import write_kubeconfig
from .state import Cluster, SimState

_JSON = "application/json"
_CLUSTER_PREFIX = re.compile(r"^/clusters/([^/]+)(/.*)?$")
_NAMESPACED = ("pods", "configmaps", "resourcequotas", "serviceaccounts")
_APPLY = "application/apply-patch+yaml"
# Groups whose kinds are stored only (kube.STORED_ONLY): group -> (version, {plural: namespaced}).
_STORED_GROUPS = {
    "apps": ("v1", {"daemonsets": True}),
    "rbac.authorization.k8s.io": ("v1", {"clusterroles": False, "clusterrolebindings": False}),
    "admissionregistration.k8s.io": (
        "v1",
        {"validatingadmissionpolicies": False, "validatingadmissionpolicybindings": False},
    ),
    # The GPU Operator's CRD (NVIDIA/gpu-operator api/nvidia/v1/clusterpolicy_types.go): stored, not acted on.
    "nvidia.com": ("v1", {"clusterpolicies": False}),
}
_DRA_NAMESPACED = ("resourceclaims", "resourceclaimtemplates")
_DRA_CLUSTER = ("resourceslices", "deviceclasses")
SCHEDULING_GROUP = "scheduling.k8s.io"
_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def _fault_error(fault) -> kube.ApiError:
    status = fault.status
    if status == 429:
        return kube.ApiError(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
            {"retryAfterSeconds": fault.retry_after},
            headers={"Retry-After": str(fault.retry_after)},
        )
    if status == 500:
        return kube.ApiError(
            500,
            "InternalError",
            "Internal error occurred: simulated fault",
            {"causes": [{"message": "simulated fault"}]},
        )
    if status == 504:
        return kube.ApiError(504, "Timeout", "Timeout: request did not complete within the allotted timeout")
    headers = {"Retry-After": str(fault.retry_after)} if status == 503 else None
    return kube.ApiError(status, _REASONS.get(status, "InternalError"), f"simulated fault ({status})", headers=headers)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format, *args):  # noqa: A002 - BaseHTTPRequestHandler's signature
        if self.server.verbose:
            super().log_message(format, *args)

    def do_GET(self):  # noqa: N802
        self._dispatch("GET")

    def do_POST(self):  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self):  # noqa: N802
        self._dispatch("PUT")

    def do_PATCH(self):  # noqa: N802
        self._dispatch("PATCH")

    def do_DELETE(self):  # noqa: N802
        self._dispatch("DELETE")

    # --- plumbing ---------------------------------------------------------------------

    def _send(self, code: int, body: bytes, headers: dict | None = None, content_type: str = _JSON) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, code: int, obj) -> None:
        self._send(code, json.dumps(obj, separators=(",", ":")).encode())

    def _send_error(self, err: kube.ApiError) -> None:
        body = err.body()
        token = getattr(err, "continue_token", None)
        if token:
            body["metadata"] = {"continue": token}
        self._send(err.code, json.dumps(body, separators=(",", ":")).encode(), err.headers)

    def _body(self):
        """The JSON request body (read up front by _dispatch), or None when empty."""
        if not self._raw_body:
            return None
        try:
            if self.headers.get("Content-Type", "").split(";")[0].strip().lower() == _APPLY:
                return yaml.safe_load(self._raw_body)  # YAML, of which JSON is a subset
            return json.loads(self._raw_body)
        except (ValueError, yaml.YAMLError):
            raise kube.bad_request(
                "the body of the request was in an unknown format - accepted media types "
                "include: application/json, application/yaml"
            ) from None

    def _dispatch(self, method: str) -> None:
        # Read the whole body first: an early error answer must not leave bytes on a keep-alive connection.
        length = int(self.headers.get("Content-Length") or 0)
        self._raw_body = self.rfile.read(length) if length else b""
        try:
            self._route(method)
        except kube.ApiError as err:
            self._send_error(err)
        except BrokenPipeError:
            pass
        except Exception as exc:  # a simulator bug must still answer like a server
            self._send_error(kube.ApiError(500, "InternalError", f"Internal error occurred: {exc!r}"))

    # --- routing ----------------------------------------------------------------------

    def _route(self, method: str) -> None:
        srv = self.server
        if srv.token and self.headers.get("Authorization") != f"Bearer {srv.token}":
            raise kube.ApiError(401, "Unauthorized", "Unauthorized")
        parts = urlsplit(self.path)
        path = parts.path
        cluster_name = None
        if m := _CLUSTER_PREFIX.match(path):
            cluster_name, path = unquote(m.group(1)), m.group(2) or "/"
            if cluster_name not in srv.state.clusters:
                raise kube.ApiError(404, "NotFound", f"no cluster {cluster_name!r} in this simulator")
        cluster = srv.state.cluster(cluster_name)
        query = parse_qs(parts.query)
        if path.startswith("/sim/v1/"):
            self._sim(method, cluster, path[len("/sim/v1") :], query)
            return
        if path.startswith("/api") or path.startswith("/apis"):
            rbac.authorize(cluster.state.api, rbac.access_of(method, path, query), self.headers.get("User-Agent", ""))
            page = None
            if method == "GET":
                try:
                    page = kube.decode_continue((query.get("continue") or [None])[-1])[1]
                except kube.ApiError:
                    page = None
            fault = srv.state.faults.take_api_fault(cluster.name, method, path, page)
            if fault is not None:
                if fault.kind == "timeout":
                    srv.stopping.wait(fault.seconds)
                if fault.kind == "page" and fault.status == 410:
                    after, _ = kube.decode_continue((query.get("continue") or [None])[-1])
                    raise kube.expired_continue(cluster.rv, after or "", page or 1)
                raise _fault_error(fault)
        self._kube(method, cluster, path, query)

    def _kube(self, method: str, cluster: Cluster, path: str, query: dict) -> None:
        segments = [unquote(s) for s in path.strip("/").split("/")]
        if path in ("/healthz", "/readyz", "/livez"):
            self._send(200, b"ok")
            return
        if method == "GET" and segments[0] == "openapi":
            self._openapi(cluster, segments[1:], query)
            return
        if method == "GET" and (answer := _discovery(cluster, segments, self.headers.get("Host", ""))) is not None:
            self._send_json(200, answer)
            return
        # One token, gpuaas's: its requests are its ServiceAccount's (the user RBAC names, admission reads).
        role = cluster.state.api.role
        api = kube.ClusterApi(
            cluster,
            user=role.user if role is not None else rbac.DEFAULT_USER,
            manager=fieldmanager.manager_from((query.get("fieldManager") or [""])[-1], self.headers.get("User-Agent")),
            dry_run=_dry_run(query),
        )
        if len(segments) >= 4 and segments[0] == "apis" and _STORED_GROUPS.get(segments[1], ("",))[0] == segments[2]:
            self._stored(method, api, _STORED_GROUPS[segments[1]][1], segments[3:], query)
            return
        if segments[:3] == ["apis", dra.GROUP, "v1"] and cluster.settings.dra:
            self._dra(method, api, segments[3:], query)
            return
        if segments[:3] == ["apis", kubevirt.GROUP, "v1"]:
            self._kubevirt(method, api, segments[3:], query)
            return
        if (
            segments[:3] == ["apis", SCHEDULING_GROUP, "v1"]
            and len(segments) in (4, 5)
            and (segments[3] == "priorityclasses")
        ):
            self._resource(method, api, "priorityclasses", None, segments[4] if len(segments) == 5 else None, query)
            return
        if segments[:2] != ["api", "v1"]:
            raise kube.ApiError(404, "NotFound", "the server could not find the requested resource", {})
        rest = segments[2:]
        # /api/v1/namespaces/{ns}/{plural}[/{name}[/eviction]]
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] in _NAMESPACED:
            namespace, plural = rest[1], rest[2]
            name = rest[3] if len(rest) >= 4 else None
            sub = rest[4] if len(rest) == 5 else None
            if len(rest) > 5 or (sub is not None and (plural, sub) != ("pods", "eviction")):
                raise kube.ApiError(404, "NotFound", "the server could not find the requested resource", {})
            if sub == "eviction":
                if method != "POST":
                    raise kube.ApiError(
                        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
                    )
                body = self._body()
                with cluster.state.lock:
                    code, payload = api.evict(namespace, name, body)
                self._send(code, payload)
                return
            self._resource(method, api, plural, namespace, name, query)
            return
        if len(rest) == 1 and rest[0] in _NAMESPACED:
            if method != "GET":
                raise kube.ApiError(
                    405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
                )
            self._resource(method, api, rest[0], None, None, query)
            return
        if rest and rest[0] in ("nodes", "namespaces") and len(rest) <= 2:
            self._resource(method, api, rest[0], None, rest[1] if len(rest) == 2 else None, query)
            return
        raise kube.ApiError(404, "NotFound", "the server could not find the requested resource", {})

    def _openapi(self, cluster: Cluster, rest: list[str], query: dict) -> None:
        """/openapi/v2 (JSON only) and /openapi/v3[/api/v1|/apis/<group>/<version>] (simcluster/openapi.py)."""
        lists = _resource_lists(cluster)
        accept = self.headers.get("Accept") or "*/*"
        if not any(t.split(";")[0].strip() in ("*/*", "application/*", _JSON) for t in accept.split(",")):
            self._send(406, b"")
            return
        if rest == ["v2"]:
            self._send(200, openapi.encode(openapi.v2_document(lists))[0])
            return
        documents = {
            ("api/" if gv == "v1" else "apis/") + gv: openapi.encode(openapi.v3_document(gv, resources))
            for gv, resources in lists.items()
        }
        if rest == ["v3"]:
            self._send_json(200, openapi.v3_discovery({gv: etag for gv, (_, etag) in documents.items()}))
            return
        if rest[:1] != ["v3"] or "/".join(rest[1:]) not in documents:
            raise kube.ApiError(404, "NotFound", "the server could not find the requested resource", {})
        gv = "/".join(rest[1:])
        body, etag = documents[gv]
        headers = {"ETag": f'"{etag}"', "Vary": "Accept"}
        if wanted := (query.get("hash") or [""])[-1]:
            if wanted != etag:
                self._send(301, b"", {"Location": f"{urlsplit(self.path).path}?hash={etag}"})
                return
            headers["Cache-Control"] = "public, immutable"
        self._send(200, body, headers)

    def _dra(self, method: str, api: kube.ClusterApi, rest: list[str], query: dict) -> None:
        """/apis/resource.k8s.io/v1/{resourceslices,deviceclasses}[/name] and
        .../namespaces/{ns}/{resourceclaims,resourceclaimtemplates}[/name] (plus the all-namespaces lists)."""
        not_found = kube.ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] in _DRA_NAMESPACED and len(rest) <= 4:
            self._resource(method, api, rest[2], rest[1], rest[3] if len(rest) == 4 else None, query)
            return
        if len(rest) == 1 and rest[0] in _DRA_NAMESPACED:
            if method != "GET":
                raise kube.ApiError(
                    405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
                )
            self._resource(method, api, rest[0], None, None, query)
            return
        if rest and rest[0] in _DRA_CLUSTER and len(rest) <= 2:
            self._resource(method, api, rest[0], None, rest[1] if len(rest) == 2 else None, query)
            return
        raise not_found

    def _kubevirt(self, method: str, api: kube.ClusterApi, rest: list[str], query: dict) -> None:
        """/apis/kubevirt.io/v1/namespaces/{ns}/{virtualmachineinstances,kubevirts}[/name] and all-namespaces lists."""
        plurals = (kubevirt.PLURAL, kubevirt_cr.PLURAL)
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] in plurals and len(rest) <= 4:
            self._resource(method, api, rest[2], rest[1], rest[3] if len(rest) == 4 else None, query)
            return
        if len(rest) == 1 and rest[0] in plurals and method == "GET":
            self._resource(method, api, rest[0], None, None, query)
            return
        raise kube.ApiError(404, "NotFound", "the server could not find the requested resource", {})

    def _stored(self, method: str, api: kube.ClusterApi, plurals: dict[str, bool], rest: list[str], query) -> None:
        """/apis/<group>/<version>/[namespaces/{ns}/]{plural}[/name] of a stored-only kind."""
        not_found = kube.ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if len(rest) >= 3 and rest[0] == "namespaces" and plurals.get(rest[2]) and len(rest) <= 4:
            self._resource(method, api, rest[2], rest[1], rest[3] if len(rest) == 4 else None, query)
            return
        if rest and rest[0] in plurals and len(rest) <= 2 and (len(rest) == 1 or not plurals[rest[0]]):
            if len(rest) == 1 and plurals[rest[0]] and method != "GET":
                raise kube.ApiError(
                    405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
                )
            self._resource(method, api, rest[0], None, rest[1] if len(rest) == 2 else None, query)
            return
        raise not_found

    def _resource(
        self, method: str, api: kube.ClusterApi, plural: str, namespace: str | None, name: str | None, query: dict
    ) -> None:
        lock = api.cluster.state.lock
        if name is None:
            if method == "GET":
                params = kube.ListParams.from_query(query)
                if params.watch:
                    self._watch(api, plural, namespace, params)
                    return
                with lock:
                    body = api.list(plural, namespace, params)
                self._send(200, _as_table(body) if self._wants_table() else body)
                return
            if method == "POST":
                payload = self._body()
                warnings = _field_validation(plural, payload, query)
                with lock:
                    code, body = api.create(plural, namespace, payload)
                self._send(code, body, warnings)
                return
            raise kube.ApiError(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
            )
        warnings = None
        if method in ("PUT", "PATCH"):
            payload = self._body()
            warnings = _field_validation(plural, payload, query)
        if method == "GET":
            with lock:
                body = api.get(plural, namespace, name)
            if self._wants_table():
                body = _as_table(body)
        elif method == "PUT":
            with lock:
                body = api.replace(plural, namespace, name, payload)
        elif method == "PATCH" and self.headers.get("Content-Type", "").split(";")[0].strip().lower() == _APPLY:
            force = (query.get("force") or ["false"])[-1].lower() in ("1", "true")
            if not (query.get("fieldManager") or [""])[-1]:
                required = [("fieldManager", "Required value: is required for apply patch")]
                raise kube.invalid("PatchOptions", "", required)
            with lock:
                code, body = api.apply(plural, namespace, name, payload, force=force)
            self._send(code, body, warnings)
            return
        elif method == "PATCH":
            with lock:
                body = api.patch(plural, namespace, name, payload, self.headers.get("Content-Type", ""))
        elif method == "DELETE":
            grace = _grace_period(query, self._body())
            with lock:
                body = api.delete(plural, namespace, name, grace)
        else:
            raise kube.ApiError(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
            )
        self._send(200, body, warnings)

    def _wants_table(self) -> bool:
        """kubectl get asks for `application/json;as=Table;v=v1;g=meta.k8s.io` (server-side printing)."""
        return "as=Table" in (self.headers.get("Accept") or "")

    def _watch(self, api: kube.ClusterApi, plural: str, namespace: str | None, params: kube.ListParams) -> None:
        """Stream watch events as JSON lines in a chunked 200 answer, as kube-apiserver does: from the
        given resourceVersion (synthetic ADDED events when none), BOOKMARKs when asked for, until
        timeoutSeconds (or the server's own limit). A compacted resourceVersion gets one ERROR event
        (Status 410 Expired) and the end of the stream."""
        srv, cluster = self.server, api.cluster
        state = cluster.state
        with state.lock:
            lines, since = api.watch_start(plural, namespace, params)  # a bad selector is still a 400 here
        deadline = time.monotonic() + (params.timeout_s or state.api.watch_timeout_s)
        bookmark_every = state.api.watch_bookmark_s
        next_bookmark = time.monotonic() + bookmark_every
        promote: set = set()
        self.send_response(200)
        self.send_header("Content-Type", _JSON)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while True:
                if lines:
                    self._chunk(b"".join(lines))
                    lines = []
                now = time.monotonic()
                if now >= deadline or srv.stopping.is_set():
                    break
                with state.lock:
                    if cluster.rv == since:
                        state.kube_changed.wait(min(deadline, next_bookmark, now + 0.5) - now)
                    try:
                        lines, since = api.watch_lines(plural, namespace, params, since, promote)
                    except kube.ApiError as err:
                        self._chunk(kube.error_line(err))
                        break
                if params.allow_bookmarks and time.monotonic() >= next_bookmark:
                    lines.append(api.bookmark(plural, since))
                    next_bookmark = time.monotonic() + bookmark_every
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    # --- simulator endpoints ----------------------------------------------------------

    def _sim(self, method: str, cluster: Cluster, path: str, query: dict) -> None:
        state = self.server.state
        segments = [unquote(s) for s in path.strip("/").split("/")]
        if segments == ["info"] and method == "GET":
            with state.lock:
                self._send_json(200, self.server.info())
            return
        if segments == ["faults"]:
            if method == "GET":
                self._send_json(200, {"api": state.faults.api_faults()})
            elif method == "POST":
                spec = self._body() or {}
                try:
                    result = state.faults.apply(spec, default_cluster=cluster)
                except (TypeError, ValueError, KeyError) as exc:
                    raise kube.bad_request(f"bad fault: {exc}") from None
                self._send_json(200, result)
            elif method == "DELETE":
                state.faults.reset()
                self._send_json(200, {"ok": True})
            else:
                raise kube.ApiError(405, "MethodNotAllowed", "use GET, POST or DELETE")
            return
        if segments == ["tick"] and method == "POST":
            spec = self._body() or {}
            state.tick(float(spec.get("seconds", 1.0)))
            if spec.get("mig_manager"):
                state.run_mig_manager()
            self._send_json(200, {"time": state.sim_time})
            return
        if len(segments) in (2, 3) and segments[0] == "nodes":
            node_name = segments[1]
            try:
                if len(segments) == 2 and method == "GET":
                    with state.lock:
                        node = cluster.nodes.get(node_name)
                        if node is None:
                            raise driver.NodeGone(node_name)
                        self._send_json(200, _node_info(node))
                    return
                if len(segments) == 3 and segments[2] == "history" and method == "GET":
                    try:
                        seconds, step = float(query["seconds"][0]), float(query["step"][0])
                        body = driver.history(state, cluster.name, node_name, seconds, step)
                    except (KeyError, IndexError, ValueError) as exc:
                        raise kube.bad_request(f"bad history query (seconds=, step=): {exc}") from None
                    self._send_json(200, body)
                    return
                if len(segments) == 3 and segments[2] == "dcgm" and method == "GET":
                    body = dcgm.metrics(state, cluster.name, node_name).encode()
                    self._send(200, body, content_type=dcgm.CONTENT_TYPE)
                    return
                if len(segments) == 3 and segments[2] == "nvml":
                    if method == "GET":
                        self._send_json(200, driver.snapshot(state, cluster.name, node_name))
                        return
                    if method == "POST":
                        spec = self._body() or {}
                        op, args = spec.get("op"), spec.get("args") or {}
                        if op == "events":
                            masks = {int(k): int(v) for k, v in (args.get("masks") or {}).items()}
                            events = driver.wait_events(
                                state,
                                cluster.name,
                                node_name,
                                int(args.get("after", 0)),
                                masks,
                                min(float(args.get("timeout_s", 0)), 60.0),
                            )
                            self._send_json(200, {"events": events})
                        else:
                            self._send_json(200, driver.nvml_op(state, cluster.name, node_name, str(op), args))
                        return
            except driver.NodeGone:
                raise kube.not_found("nodes", node_name) from None
        raise kube.ApiError(404, "NotFound", f"no simulator endpoint {method} {path}", {})


_TABLE_COLUMNS = [
    {"name": "Name", "type": "string", "format": "name", "description": "Name of the object.", "priority": 0},
    {"name": "Created At", "type": "date", "format": "", "description": "When it was created.", "priority": 0},
]


def _as_table(body: bytes) -> bytes:
    """A list or object as a meta.k8s.io/v1 Table with kube-apiserver's default columns (Name, Created At: its
    default table convertor for kinds without their own printer), each row carrying the object's metadata."""
    obj = json.loads(body)
    items = obj.get("items") if "items" in obj else [obj]
    list_meta = (
        obj.get("metadata") or {} if "items" in obj else {"resourceVersion": obj["metadata"].get("resourceVersion")}
    )
    rows = [
        {
            "cells": [item["metadata"].get("name", ""), item["metadata"].get("creationTimestamp")],
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": {k: v for k, v in item["metadata"].items() if k != "managedFields"},
            },
        }
        for item in items or ()
    ]
    table = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": _TABLE_COLUMNS,
        "rows": rows,
    }
    return json.dumps(table, separators=(",", ":")).encode()


def _dry_run(query: dict) -> bool:
    """`dryRun=All` (the only value kube-apiserver accepts)."""
    values = query.get("dryRun") or []
    if any(v != "All" for v in values):
        raise kube.bad_request(f'dryRun: Unsupported value: {values[-1]!r}: supported values: "All"')
    return bool(values)


def _grace_period(query: dict, body) -> int | None:
    """gracePeriodSeconds of a DELETE: the query parameter, else the DeleteOptions body."""
    values = query.get("gracePeriodSeconds")
    value = values[-1] if values else (body or {}).get("gracePeriodSeconds") if isinstance(body, dict) else None
    if value in (None, ""):
        return None
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        raise kube.bad_request(f"gracePeriodSeconds must be an integer, got {value!r}") from None


# What /api/v1 serves: (name, kind, namespaced, verbs), as kube-apiserver lists them.
_READ_WRITE = ["create", "delete", "get", "list", "patch", "update", "watch"]
_RESOURCES = (
    ("configmaps", "ConfigMap", True, _READ_WRITE),
    ("namespaces", "Namespace", False, _READ_WRITE),
    ("nodes", "Node", False, ["delete", "get", "list", "patch", "update", "watch"]),
    ("pods", "Pod", True, _READ_WRITE),
    ("pods/eviction", "Eviction", True, ["create"]),
    ("resourcequotas", "ResourceQuota", True, _READ_WRITE),
    ("serviceaccounts", "ServiceAccount", True, _READ_WRITE),
)
# kube-apiserver's short names for them (`kubectl get cm`).
_SHORT_NAMES = {
    "configmaps": ["cm"],
    "namespaces": ["ns"],
    "nodes": ["no"],
    "pods": ["po"],
    "resourcequotas": ["quota"],
    "serviceaccounts": ["sa"],
}
_DRA_RESOURCES = (
    ("deviceclasses", "DeviceClass", False, _READ_WRITE),
    ("resourceclaims", "ResourceClaim", True, _READ_WRITE),
    ("resourceclaimtemplates", "ResourceClaimTemplate", True, _READ_WRITE),
    ("resourceslices", "ResourceSlice", False, _READ_WRITE),
)


def _discovery(cluster: Cluster, segments: list[str], host: str) -> dict | None:
    """/version, /api, /apis and /api/v1 in the shapes the official client's models require
    (VersionInfo, V1APIVersions, V1APIGroupList, V1APIResourceList); None for other paths."""
    if segments == ["version"]:
        version = cluster.settings.kubernetes_version
        major, minor = version.lstrip("v").split(".")[:2]
        return {
            "major": major,
            "minor": minor,
            "gitVersion": version,
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2024-12-10T00:00:00Z",
            "goVersion": "go1.22.9",
            "compiler": "gc",
            "platform": "linux/amd64",
        }
    if segments == ["api"]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
        }
    dra_group = {
        "name": dra.GROUP,
        "versions": [{"groupVersion": dra.API_VERSION, "version": "v1"}],
        "preferredVersion": {"groupVersion": dra.API_VERSION, "version": "v1"},
    }
    scheduling_group = {
        "name": SCHEDULING_GROUP,
        "versions": [{"groupVersion": f"{SCHEDULING_GROUP}/v1", "version": "v1"}],
        "preferredVersion": {"groupVersion": f"{SCHEDULING_GROUP}/v1", "version": "v1"},
    }
    kubevirt_group = {
        "name": kubevirt.GROUP,
        "versions": [{"groupVersion": kubevirt.API_VERSION, "version": "v1"}],
        "preferredVersion": {"groupVersion": kubevirt.API_VERSION, "version": "v1"},
    }
    stored_groups = {
        group: {
            "name": group,
            "versions": [{"groupVersion": f"{group}/{version}", "version": version}],
            "preferredVersion": {"groupVersion": f"{group}/{version}", "version": version},
        }
        for group, (version, _) in _STORED_GROUPS.items()
    }
    if segments == ["apis"]:
        # policy/v1 is served only as the pods/eviction subresource, so no group is listed for it.
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                scheduling_group,
                *stored_groups.values(),
                *([dra_group] if cluster.settings.dra else []),
                kubevirt_group,
            ],
        }
    if segments == ["apis", kubevirt.GROUP]:
        return {"kind": "APIGroup", "apiVersion": "v1", **kubevirt_group}
    if segments == ["apis", kubevirt.GROUP, "v1"]:
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": kubevirt.API_VERSION,
            "resources": [
                {
                    "name": kubevirt.PLURAL,
                    "singularName": "virtualmachineinstance",
                    "namespaced": True,
                    "kind": "VirtualMachineInstance",
                    "shortNames": ["vmi", "vmis"],
                    "verbs": _READ_WRITE,
                },
                {**kubevirt_cr.DISCOVERY, "verbs": _READ_WRITE},
            ],
        }
    if len(segments) in (2, 3) and segments[0] == "apis" and segments[1] in stored_groups:
        group = stored_groups[segments[1]]
        if len(segments) == 2:
            return {"kind": "APIGroup", "apiVersion": "v1", **group}
        version, plurals = _STORED_GROUPS[segments[1]]
        if segments[2] != version:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{segments[1]}/{version}",
            "resources": [
                {
                    "name": plural,
                    "singularName": kube.KINDS[plural].kind.lower(),
                    "namespaced": namespaced,
                    "kind": kube.KINDS[plural].kind,
                    "verbs": _READ_WRITE,
                }
                for plural, namespaced in plurals.items()
            ],
        }
    if segments == ["apis", SCHEDULING_GROUP]:
        return {"kind": "APIGroup", "apiVersion": "v1", **scheduling_group}
    if segments == ["apis", SCHEDULING_GROUP, "v1"]:
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{SCHEDULING_GROUP}/v1",
            "resources": [
                {
                    "name": "priorityclasses",
                    "singularName": "priorityclass",
                    "namespaced": False,
                    "kind": "PriorityClass",
                    "verbs": _READ_WRITE,
                }
            ],
        }
    if segments == ["apis", dra.GROUP] and cluster.settings.dra:
        return {"kind": "APIGroup", "apiVersion": "v1", **dra_group}
    if segments == ["apis", dra.GROUP, "v1"] and cluster.settings.dra:
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": dra.API_VERSION,
            "resources": [
                {"name": name, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind, "verbs": verbs}
                for name, kind, namespaced, verbs in _DRA_RESOURCES
            ],
        }
    if segments == ["api", "v1"]:
        return {
            "kind": "APIResourceList",
            "groupVersion": "v1",
            "resources": [
                {
                    "name": name,
                    "singularName": "" if "/" in name else kind.lower(),
                    "namespaced": namespaced,
                    "kind": kind,
                    "verbs": verbs,
                    **({"shortNames": _SHORT_NAMES[name]} if name in _SHORT_NAMES else {}),
                    **({"group": "policy", "version": "v1"} if "/" in name else {}),
                }
                for name, kind, namespaced, verbs in _RESOURCES
            ],
        }
    return None


def _resource_lists(cluster: Cluster) -> dict[str, list[dict]]:
    """groupVersion -> the resources discovery lists for it: what the OpenAPI documents describe."""
    lists = {"v1": _discovery(cluster, ["api", "v1"], "")["resources"]}
    for group in _discovery(cluster, ["apis"], "")["groups"]:
        group_version = group["preferredVersion"]["groupVersion"]
        lists[group_version] = _discovery(cluster, ["apis", *group_version.split("/")], "")["resources"]
    return lists


def _field_validation(plural: str, body: object, query: dict) -> dict | None:
    """kube-apiserver's `fieldValidation` (Ignore | Warn | Strict) of a write's body: unknown fields are a
    400 under Strict, a `Warning` header under Warn. Answers the headers to send, if any."""
    directive = (query.get("fieldValidation") or ["Ignore"])[-1]
    if directive not in ("Ignore", "Warn", "Strict"):
        raise kube.bad_request(f'fieldValidation: Unsupported value: "{directive}"')
    if directive == "Ignore" or not isinstance(body, dict):
        return None
    known = kube.KINDS.get(plural)
    group, _, version = (known.api_version if known else "v1").rpartition("/")
    unknown = openapi.unknown_fields(body, group, version, known.kind if known else "Node")
    if not unknown:
        return None
    if directive == "Strict":
        raise kube.bad_request("strict decoding error: " + ", ".join(f'unknown field "{f}"' for f in unknown))
    return {"Warning": ", ".join(f'299 - "unknown field \\"{f}\\""' for f in unknown)}


def _node_info(node) -> dict:
    return {
        "name": node.name,
        "mig_strategy": node.mig_strategy,
        "mig_job": node.mig_job.config if node.mig_job else None,
        "mig_message": node.mig_message,
        "sharing": None
        if node.sharing is None
        else {
            "strategy": node.sharing.strategy,
            "replicas": node.sharing.replicas,
            "renameByDefault": node.sharing.rename_by_default,
        },
        "devices": node.devices,
        "assigned": {k: "/".join(v) for k, v in node.assigned.items()},
        "gpus": [
            {"index": g.index, "uuid": g.uuid, "lost": g.lost, "mig": g.mig_current, "layout": g.layout()}
            for g in node.gpus
        ],
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, state: SimState, token: str | None, verbose: bool, owner: SimServer):
        super().__init__(address, _Handler)
        self.state = state
        self.token = token
        self.verbose = verbose
        self.stopping = threading.Event()
        self.info = owner.info


class SimServer:
    """Serve a SimState over HTTP from background threads.

        server = SimServer(state, host="127.0.0.1", port=0).start()
        server.url                    # http://127.0.0.1:PORT (the first cluster)
        server.cluster_url("prod")    # http://127.0.0.1:PORT/clusters/prod
        server.stop()

    `token`: require `Authorization: Bearer <token>` (default: accept anything).
    `tick_interval`: advance simulated time with the wall clock every so many seconds.
    `pod_resources`: serve every node's kubelet PodResources socket under this directory (default
    `podresources.DEFAULT_ROOT`, what gpuaas' DEBUG settings read); False: none.
    """

    def __init__(
        self,
        state: SimState,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | None = None,
        tick_interval: float | None = None,
        verbose: bool = False,
        pod_resources: bool | str | Path = True,
    ):
        self.state = state
        root = podresources.DEFAULT_ROOT if pod_resources is True else pod_resources
        self.pod_resources_root = None if root is False else Path(root)
        self.pod_resources: podresources.PodResourcesHost | None = None
        self.host = host
        self.port = port
        self.token = token
        self.tick_interval = tick_interval
        self.verbose = verbose
        self._httpd: _Server | None = None
        self._threads: list[threading.Thread] = []

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> SimServer:
        if self._httpd is not None:
            raise RuntimeError("already started")
        self._httpd = _Server((self.host, self.port), self.state, self.token, self.verbose, self)
        self.port = self._httpd.server_address[1]
        serve = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"simcluster-http-{self.port}",
            daemon=True,
        )
        background = threading.Thread(target=self._background, name=f"simcluster-bg-{self.port}", daemon=True)
        self._threads = [serve, background]
        for thread in self._threads:
            thread.start()
        nvml.register_local(self.url, self.state, None)
        for name in self.state.clusters:
            nvml.register_local(self.cluster_url(name), self.state, name)
        if self.pod_resources_root is not None:
            urls = {name: self.cluster_url(name) for name in self.state.clusters}
            self.pod_resources = podresources.PodResourcesHost(self.state, urls, self.pod_resources_root)
            self.pod_resources.sync()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        nvml.unregister_local(self.url)
        for name in self.state.clusters:
            nvml.unregister_local(self.cluster_url(name))
        self._httpd.stopping.set()
        with self.state.lock:
            self.state.events_changed.notify_all()
            self.state.kube_changed.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._httpd = None
        if self.pod_resources is not None:
            self.pod_resources.stop()
            self.pod_resources = None

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _background(self) -> None:
        httpd = self._httpd
        last = time.monotonic()
        synced = last
        while not httpd.stopping.wait(0.05):
            self.state.run_mig_manager(due_only=True)
            self.state.run_kubelet(due_only=True)
            if self.pod_resources is not None and time.monotonic() - synced >= 0.5:
                self.pod_resources.sync()  # nodes added or removed, and the pod_resources knob
                synced = time.monotonic()
            if self.tick_interval:
                now = time.monotonic()
                if now - last >= self.tick_interval:
                    self.state.tick(now - last)
                    last = now

    # --- addresses and kubeconfigs ----------------------------------------------------

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def cluster_url(self, cluster: str) -> str:
        self.state.cluster(cluster)
        return f"{self.url}/clusters/{cluster}"

    def dcgm_exporter_urls(self, cluster: str) -> list[str]:
        """Each node's dcgm-exporter /metrics URL, what a cluster's `dcgm_exporter_url` lists."""
        with self.state.lock:
            nodes = self.state.cluster(cluster).node_names()
        return [f"{self.cluster_url(cluster)}/sim/v1/nodes/{node}/dcgm" for node in nodes]

    def write_kubeconfigs(self, directory: str | Path, token: str = "simcluster") -> dict[str, Path]:
        """One kubeconfig per cluster, `<dir>/<cluster>.kubeconfig`; returns name -> path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        return {
            name: write_kubeconfig(
                directory / f"{name}.kubeconfig", self.cluster_url(name), name=name, token=self.token or token
            )
            for name in self.state.clusters
        }

    def info(self) -> dict:
        state = self.state
        return {
            "url": self.url,
            "seed": state.seed,
            "sim_time": state.sim_time,
            "clusters": {
                name: {
                    "url": self.cluster_url(name),
                    "nodes": len(c.nodes),
                    "gpus": sum(len(n.gpus) for n in c.nodes.values()),
                    "pods": len(c.pods),
                    "pending_mig_jobs": sum(1 for n in c.nodes.values() if n.mig_job),
                }
                for name, c in state.clusters.items()
            },
            "scenario": state.scenario_name,
        }

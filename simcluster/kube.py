"""Kubernetes API semantics for the simulator, independent of HTTP.

`ClusterApi` answers list/get/create/replace/patch/delete for nodes, namespaces, pods,
configmaps and resourcequotas the way kube-apiserver does: resourceVersion on every
write, uid/creationTimestamp on create, label and field selectors, limit/continue paging
with an opaque token, JSON merge / strategic merge / JSON patch, server-side apply with managedFields and
`dryRun=All` (simcluster.fieldmanager), and real-shaped `Status`
errors (404 NotFound, 409 AlreadyExists/Conflict, 422 Invalid, 403 Forbidden, 400
BadRequest, 410 Expired).

Nodes are the hot path (a 2,000-node list): each node's JSON is rendered once into bytes,
cached on the node and invalidated by `Cluster.touch()`; a list page is the cached bytes
joined. Other objects are stored as their JSON dicts (`Record`), with cached bytes too.

Strategic merge patch merges lists of maps by their patchMergeKey for the core/v1 fields
that declare one (containers by name, env by name, conditions by type, ...; see
`_MERGE_KEYS`) and honours `$patch: delete|replace`; every other list (node taints and pod
tolerations are `atomic` in k8s.io/api) is replaced whole, as kube-apiserver does.

Every write is logged as a watch event (`Cluster.record_event`), which feeds `watch=true`
streams and decides when an old resourceVersion or continue token is gone (410).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import copy
import json
import re
from dataclasses import dataclass

import json_merge_patch
import jsonpatch
import jsonpointer

from . import admission, disruption, dra, fieldmanager, gpuoperator, kubevirt, kubevirt_cr, scheduler
from .state import Cluster, Node, Record

_DUMPS = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

# ----------------------------------------------------------------------------------------
# Errors


class ApiError(Exception):
    """A Kubernetes `Status` failure: raised anywhere, rendered by the HTTP layer."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None, headers=None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def body(self) -> dict:
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            status["details"] = self.details
        status["code"] = self.code
        return status


def not_found(plural: str, name: str, group: str = "") -> ApiError:
    resource = f"{plural}.{group}" if group else plural
    details = {"name": name, "kind": plural}
    if group:
        details["group"] = group
    return ApiError(404, "NotFound", f'{resource} "{name}" not found', details)


def already_exists(plural: str, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{plural} "{name}" already exists', {"name": name, "kind": plural})


def conflict(plural: str, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {plural} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        {"name": name, "kind": plural},
    )


def invalid(kind: str, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422 Invalid; causes = [(field, message)]."""
    text = ", ".join(f"{f}: {m}" for f, m in causes)
    if len(causes) > 1:
        text = "[" + text + "]"
    return ApiError(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {text}',
        {
            "name": name,
            "kind": kind,
            "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in causes],
        },
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def forbidden(plural: str, name: str, why: str) -> ApiError:
    return ApiError(403, "Forbidden", f'{plural} "{name}" is forbidden: {why}', {"name": name, "kind": plural})


def success_status(plural: str, name: str, uid: str, code: int = 200) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "kind": plural, "uid": uid},
        **({"code": code} if code != 200 else {}),
    }


# ----------------------------------------------------------------------------------------
# Validation (messages as kube-apiserver words them)

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")

_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used "
    "for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
_QUALIFIED_NAME_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)


def name_problems(name: object, rule: str) -> list[tuple[str, str]]:
    if not isinstance(name, str) or not name:
        return [("metadata.name", "Required value: name or generateName is required")]
    if rule == "label":
        if len(name) > 63 or not _DNS1123_LABEL.match(name):
            return [("metadata.name", f'Invalid value: "{name}": {_LABEL_MSG}')]
    elif len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        return [("metadata.name", f'Invalid value: "{name}": {_SUBDOMAIN_MSG}')]
    return []


def label_problems(labels: object, field: str = "metadata.labels") -> list[tuple[str, str]]:
    if labels is None:
        return []
    if not isinstance(labels, dict):
        return [(field, "Invalid value: must be a map of strings")]
    problems = []
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if (
            (prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)))
            or len(name) > 63
            or not (_LABEL_NAME.match(name))
        ):
            problems.append((field, f'Invalid value: "{key}": {_QUALIFIED_NAME_MSG}'))
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            problems.append((field, f'Invalid value: "{value}": {_LABEL_VALUE_MSG}'))
    return problems


def annotation_problems(annotations: object) -> list[tuple[str, str]]:
    if annotations is None:
        return []
    if not isinstance(annotations, dict) or not all(isinstance(v, str) for v in annotations.values()):
        return [("metadata.annotations", "Invalid value: annotations must be a map of strings")]
    return []


# ----------------------------------------------------------------------------------------
# Selectors


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # = != in notin exists !exists gt lt
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        op = self.op
        if op == "=":
            return present and value == self.values[0]
        if op == "!=":
            return not present or value != self.values[0]
        if op == "in":
            return present and value in self.values
        if op == "notin":
            return not present or value not in self.values
        if op == "exists":
            return present
        if op == "!exists":
            return not present
        try:
            number = int(value) if present else None
        except ValueError:
            return False
        if number is None:
            return False
        return number > int(self.values[0]) if op == "gt" else number < int(self.values[0])


_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_REQ_SET = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s+\(([^)]*)\)\s*$")
_REQ_EQ = re.compile(rf"^\s*({_KEY})\s*(==|=|!=)\s*([-A-Za-z0-9_.]*)\s*$")
_REQ_CMP = re.compile(rf"^\s*({_KEY})\s*(>|<)\s*(-?\d+)\s*$")
_REQ_EXISTS = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


def _split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Parse `a=b,c!=d,e in (x,y),f notin (z),g,!h,n>3` into requirements."""
    if not text or not text.strip():
        return []
    requirements = []
    for part in _split_top(text):
        if m := _REQ_SET.match(part):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            requirements.append(Requirement(m.group(1), m.group(2), values))
        elif m := _REQ_EQ.match(part):
            requirements.append(Requirement(m.group(1), "!=" if m.group(2) == "!=" else "=", (m.group(3),)))
        elif m := _REQ_CMP.match(part):
            requirements.append(Requirement(m.group(1), "gt" if m.group(2) == ">" else "lt", (m.group(3),)))
        elif m := _REQ_EXISTS.match(part):
            requirements.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise bad_request(
                f"unable to parse requirement: found '{part.strip()}', expected: in, notin, =, ==, !=, gt, lt"
            )
    return requirements


def labels_match(requirements: list[Requirement], labels: dict[str, str]) -> bool:
    return all(r.matches(labels) for r in requirements)


def node_selector_terms_match(terms: list[dict], labels: dict[str, str]) -> bool:
    """requiredDuringSchedulingIgnoredDuringExecution nodeSelectorTerms (ORed) on labels."""
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists", "Gt": "gt", "Lt": "lt"}
    for term in terms:
        reqs = [
            Requirement(e["key"], ops[e["operator"]], tuple(e.get("values") or ()))
            for e in term.get("matchExpressions") or []
            if e.get("operator") in ops
        ]
        if labels_match(reqs, labels):
            return True
    return not terms


# Field selectors each kind supports (others answer 400 like kube-apiserver).
FIELD_PATHS: dict[str, dict[str, tuple[str, ...]]] = {
    "nodes": {"metadata.name": ("metadata", "name"), "spec.unschedulable": ("spec", "unschedulable")},
    "namespaces": {"metadata.name": ("metadata", "name"), "status.phase": ("status", "phase")},
    "pods": {
        "metadata.name": ("metadata", "name"),
        "metadata.namespace": ("metadata", "namespace"),
        "spec.nodeName": ("spec", "nodeName"),
        "spec.restartPolicy": ("spec", "restartPolicy"),
        "spec.schedulerName": ("spec", "schedulerName"),
        "spec.serviceAccountName": ("spec", "serviceAccountName"),
        "status.phase": ("status", "phase"),
        "status.podIP": ("status", "podIP"),
        "status.nominatedNodeName": ("status", "nominatedNodeName"),
    },
    "configmaps": {"metadata.name": ("metadata", "name"), "metadata.namespace": ("metadata", "namespace")},
    "resourcequotas": {"metadata.name": ("metadata", "name"), "metadata.namespace": ("metadata", "namespace")},
    "resourceslices": {
        "metadata.name": ("metadata", "name"),
        "spec.nodeName": ("spec", "nodeName"),
        "spec.driver": ("spec", "driver"),
    },
    "deviceclasses": {"metadata.name": ("metadata", "name")},
    "priorityclasses": {"metadata.name": ("metadata", "name")},
    "poddisruptionbudgets": {"metadata.name": ("metadata", "name"), "metadata.namespace": ("metadata", "namespace")},
    "resourceclaims": {"metadata.name": ("metadata", "name"), "metadata.namespace": ("metadata", "namespace")},
    "resourceclaimtemplates": {"metadata.name": ("metadata", "name"), "metadata.namespace": ("metadata", "namespace")},
    "virtualmachineinstances": {
        "metadata.name": ("metadata", "name"),
        "metadata.namespace": ("metadata", "namespace"),
    },
}


def parse_field_selector(plural: str, text: str | None) -> list[tuple[tuple[str, ...], bool, str]]:
    """[(path, equal?, value)]; unsupported fields raise 400 like the real API."""
    if not text or not text.strip():
        return []
    allowed = FIELD_PATHS[plural]
    result = []
    for part in text.split(","):
        m = re.match(r"^\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        field, op, value = m.groups()
        if field not in allowed:
            raise bad_request(f"field label not supported: {field}")
        result.append((allowed[field], op != "!=", value))
    return result


def field_value(obj: dict, path: tuple[str, ...]) -> str:
    value: object = obj
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return "" if path != ("spec", "unschedulable") else "false"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def fields_match(selectors, obj: dict) -> bool:
    return all((field_value(obj, path) == value) == equal for path, equal, value in selectors)


# ----------------------------------------------------------------------------------------
# Patches


def merge_patch(target: object, patch: object) -> object:
    """RFC 7386 JSON merge patch (json-merge-patch): objects merge recursively, null deletes, the rest replaces.

    The library merges into its first argument and shares the patch's values, so both are copied.
    """
    return json_merge_patch.merge(copy.deepcopy(target), copy.deepcopy(patch))


_REJECTED = "the server rejected our request due to an error in our request"


def json_patch(target: dict, operations: list) -> dict:
    """RFC 6902 JSON patch (jsonpatch), one operation at a time so that a failed `test` names its path as
    kube-apiserver does; an operation that does not apply is its 422, the patch as a whole changes nothing."""
    doc = copy.deepcopy(target)
    for op in operations:
        try:
            doc = jsonpatch.apply_patch(doc, [op], in_place=True)
        except jsonpatch.JsonPatchTestFailed:
            raise ApiError(422, "Invalid", f"{_REJECTED}: testing value {op['path']} failed") from None
        except jsonpatch.InvalidJsonPatch as exc:
            raise bad_request(str(exc)) from None
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, KeyError, IndexError, TypeError) as exc:
            raise ApiError(422, "Invalid", f"{_REJECTED}: {exc}") from None
    return doc


# patchMergeKey of the core/v1 lists of maps that have `patchStrategy:"merge"` (k8s.io/api core/v1
# types.go), by path from the object root; "[]" stands for any item of the list before it. Lists of
# scalars with the merge strategy (finalizers, podCIDRs) merge as sets (None key).
_MERGE_KEYS: dict[tuple[str, ...], str | None] = {
    ("metadata", "finalizers"): None,
    ("metadata", "ownerReferences"): "uid",
    ("spec", "podCIDRs"): None,
    ("spec", "containers"): "name",
    ("spec", "initContainers"): "name",
    ("spec", "ephemeralContainers"): "name",
    ("spec", "volumes"): "name",
    ("spec", "imagePullSecrets"): "name",
    ("spec", "hostAliases"): "ip",
    ("spec", "schedulingGates"): "name",
    ("spec", "resourceClaims"): "name",
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
    **{
        ("spec", group, "[]", field): key
        for group in ("containers", "initContainers", "ephemeralContainers")
        for field, key in (
            ("env", "name"),
            ("ports", "containerPort"),
            ("volumeMounts", "mountPath"),
            ("volumeDevices", "devicePath"),
            ("resizePolicy", "resourceName"),
        )
    },
}


def strategic_merge_patch(target: object, patch: object, path: tuple[str, ...] = ()) -> object:
    """Kubernetes strategic merge patch for core/v1: JSON merge patch, except that the lists in
    `_MERGE_KEYS` merge item by item (`{"$patch": "delete"}` removes an item) and a map with
    `"$patch": "replace"` replaces instead of merging."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        here = (*path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and here in _MERGE_KEYS and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value, _MERGE_KEYS[here], here)
        elif isinstance(value, list):
            result[key] = [item for item in copy.deepcopy(value) if not (isinstance(item, dict) and item.get("$patch"))]
        else:
            result[key] = strategic_merge_patch(result.get(key), value, here)
    return result


def _merge_list(current: list, patch: list, merge_key: str | None, path: tuple[str, ...]) -> list:
    if merge_key is None:  # a set of scalars: add the new ones, keep the order
        return list(current) + [v for v in patch if v not in current]
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and i.get("$patch"))]
    merged = [copy.deepcopy(item) for item in current]
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise bad_request(f"map: {item} does not contain declared merge key: {merge_key}")
        at = next(
            (i for i, old in enumerate(merged) if isinstance(old, dict) and old.get(merge_key) == item[merge_key]), None
        )
        if item.get("$patch") == "delete":
            if at is not None:
                merged.pop(at)
        elif at is None:
            merged.append({k: v for k, v in copy.deepcopy(item).items() if k != "$patch"})
        else:
            merged[at] = strategic_merge_patch(merged[at], item, (*path, "[]"))
    return merged


def apply_patch(target: dict, body: object, content_type: str) -> dict:
    ctype = (content_type or "").split(";")[0].strip().lower()
    if ctype == "application/json-patch+json":
        if not isinstance(body, list):
            raise bad_request("json patch must be a list of operations")
        return json_patch(target, body)
    if ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
        if not isinstance(body, dict):
            raise bad_request("patch body must be a JSON object")
        if ctype == "application/strategic-merge-patch+json":
            return strategic_merge_patch(target, body)
        return merge_patch(target, body)
    raise ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted "
        f"media types include: application/json-patch+json, application/merge-patch+json, "
        f"application/apply-patch+yaml; got {content_type!r}",
    )


# ----------------------------------------------------------------------------------------
# Paging


def encode_continue(rv: int, last_key: str, page: int, snapshot: str | None = None) -> str:
    """An opaque token: the list's resourceVersion, the key to resume after, the page number and
    the snapshot holding the remaining pages (none: continue from the live state, the
    inconsistent continuation a 410 offers)."""
    fields = {"v": "meta.k8s.io/v1", "rv": rv, "start": last_key, "page": page}
    if snapshot:
        fields["snap"] = snapshot
    return base64.urlsafe_b64encode(_DUMPS(fields).encode()).decode().rstrip("=")


def continue_fields(token: str) -> dict:
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        return {"rv": int(data["rv"]), "start": str(data["start"]), "page": int(data["page"]), "snap": data.get("snap")}
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise bad_request("continue key is not valid: illegal base64 data at input byte 0") from None


def decode_continue(token: str | None) -> tuple[str | None, int]:
    """(key to resume after, page number of the page to serve); page 1 for no token."""
    if not token:
        return None, 1
    fields = continue_fields(token)
    return fields["start"], fields["page"]


def too_old(rv: int, current: int) -> ApiError:
    """410 for a resourceVersion etcd has compacted, worded as kube-apiserver words it."""
    return ApiError(410, "Expired", f"too old resource version: {rv} ({current})")


def expired_continue(rv: int, last_key: str, page: int) -> ApiError:
    err = ApiError(
        410,
        "Expired",
        "The provided continue parameter is too old to display a consistent list result. You can start a new "
        "list without the continue parameter, or use the continue token in this response to retrieve the "
        "remainder of the results. Continuing with the provided token results in an inconsistent list - objects "
        "that were created, modified, or deleted between the time the first chunk was returned and now may show "
        "up in the list.",
    )
    err.continue_token = encode_continue(rv, last_key, page)
    return err


# What Go's strconv.ParseBool takes as true: the official Python client sends `watch=True`.
_TRUE = ("1", "t", "T", "TRUE", "true", "True")


@dataclass
class ListParams:
    label_selector: str | None = None
    field_selector: str | None = None
    limit: int = 0
    continue_token: str | None = None
    resource_version: str | None = None
    resource_version_match: str | None = None
    watch: bool = False
    allow_bookmarks: bool = False
    timeout_s: float | None = None

    @classmethod
    def from_query(cls, query: dict[str, list[str]]) -> ListParams:
        def one(name: str) -> str | None:
            values = query.get(name)
            return values[-1] if values else None

        def number(name: str) -> int:
            text = one(name)
            try:
                return int(text) if text else 0
            except ValueError:
                raise bad_request(f"{name} must be an integer, got {text!r}") from None

        timeout = number("timeoutSeconds")
        return cls(
            one("labelSelector"),
            one("fieldSelector"),
            max(0, number("limit")),
            one("continue"),
            one("resourceVersion") or None,
            one("resourceVersionMatch") or None,
            one("watch") in _TRUE,
            one("allowWatchBookmarks") in _TRUE,
            float(timeout) if timeout > 0 else None,
        )

    def start_rv(self) -> int | None:
        """The resourceVersion a watch or list names; None for unset or "0" (any/most recent)."""
        if self.resource_version in (None, "", "0"):
            return None
        try:
            return int(self.resource_version)
        except ValueError:
            raise bad_request(f"invalid resource version: {self.resource_version!r}") from None


def _list_bytes(
    kind: str,
    rv: int,
    items: list[bytes],
    next_key: str | None,
    page: int,
    remaining: int | None,
    snapshot: str | None = None,
    api_version: str = "v1",
) -> bytes:
    meta: dict = {"resourceVersion": str(rv)}
    if next_key is not None:
        meta["continue"] = encode_continue(rv, next_key, page + 1, snapshot)
        if remaining is not None:
            meta["remainingItemCount"] = remaining
    head = (
        b'{"kind":"'
        + kind.encode()
        + b'","apiVersion":"'
        + api_version.encode()
        + b'","metadata":'
        + _DUMPS(meta).encode()
        + b',"items":['
    )
    return head + b",".join(items) + b"]}"


def _event_line(kind: str, raw: bytes) -> bytes:
    """One watch event as the JSON line kube-apiserver streams."""
    return b'{"type":"' + kind.encode() + b'","object":' + raw + b"}\n"


def error_line(err: ApiError) -> bytes:
    """A watch's ERROR event: the Status of why it ends (410 Expired for a compacted resourceVersion)."""
    return _event_line("ERROR", _DUMPS(err.body()).encode())


# ----------------------------------------------------------------------------------------
# Node rendering


def render_node(cluster: Cluster, node: Node) -> dict:
    capacity, allocatable = gpuoperator.node_resources(node)
    conditions = []
    stamp = node.created
    for ctype, reason, message in (
        ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ):
        conditions.append(
            {
                "type": ctype,
                "status": "False",
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
                "reason": reason,
                "message": message,
            }
        )
    conditions.append(
        {
            "type": "Ready",
            "status": "True" if node.ready else "Unknown",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
            "reason": "KubeletReady" if node.ready else "NodeStatusUnknown",
            "message": "kubelet is posting ready status" if node.ready else "Kubelet stopped posting node status.",
        }
    )
    spec: dict = {"podCIDR": node.pod_cidr, "podCIDRs": [node.pod_cidr]}
    if node.unschedulable:
        spec["unschedulable"] = True
    if node.taints:
        spec["taints"] = node.taints
    version = cluster.settings.kubernetes_version
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": node.name,
            "uid": node.uid,
            "resourceVersion": node.resource_version,
            "creationTimestamp": node.created,
            "labels": node.labels,
            "annotations": node.annotations,
        },
        "spec": spec,
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": node.address}, {"type": "Hostname", "address": node.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": node.uid.replace("-", ""),
                "systemUUID": node.uid.upper(),
                "bootID": node.uid[::-1],
                "kernelVersion": "5.15.0-122-generic",
                "osImage": "Ubuntu 22.04.5 LTS",
                "containerRuntimeVersion": "containerd://1.7.22",
                "kubeletVersion": version,
                "kubeProxyVersion": version,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def node_json(cluster: Cluster, node: Node) -> bytes:
    if node.json_cache is None:
        node.json_cache = _DUMPS(render_node(cluster, node)).encode()
    return node.json_cache


# ----------------------------------------------------------------------------------------
# Stored kinds


@dataclass(frozen=True)
class Kind:
    plural: str
    kind: str
    namespaced: bool
    name_rule: str  # "label" | "subdomain"
    delete_returns_object: bool
    api_version: str = "v1"


KINDS = {
    "namespaces": Kind("namespaces", "Namespace", False, "label", True),
    "pods": Kind("pods", "Pod", True, "subdomain", True),
    "configmaps": Kind("configmaps", "ConfigMap", True, "subdomain", False),
    "resourcequotas": Kind("resourcequotas", "ResourceQuota", True, "subdomain", True),
    "resourceslices": Kind("resourceslices", "ResourceSlice", False, "subdomain", True, dra.API_VERSION),
    "deviceclasses": Kind("deviceclasses", "DeviceClass", False, "subdomain", True, dra.API_VERSION),
    "resourceclaims": Kind("resourceclaims", "ResourceClaim", True, "subdomain", True, dra.API_VERSION),
    "resourceclaimtemplates": Kind(
        "resourceclaimtemplates", "ResourceClaimTemplate", True, "subdomain", True, dra.API_VERSION
    ),
}
KINDS["priorityclasses"] = Kind("priorityclasses", "PriorityClass", False, "subdomain", True, "scheduling.k8s.io/v1")
KINDS["poddisruptionbudgets"] = Kind(
    "poddisruptionbudgets", "PodDisruptionBudget", True, "subdomain", True, disruption.API_VERSION
)
KINDS[kubevirt.PLURAL] = Kind(kubevirt.PLURAL, "VirtualMachineInstance", True, "subdomain", True, kubevirt.API_VERSION)
KINDS[kubevirt_cr.PLURAL] = Kind(kubevirt_cr.PLURAL, kubevirt_cr.KIND, True, "subdomain", True, kubevirt.API_VERSION)
_RBAC = "rbac.authorization.k8s.io/v1"
_ADMISSION = "admissionregistration.k8s.io/v1"
STORED_ONLY = {
    "serviceaccounts": Kind("serviceaccounts", "ServiceAccount", True, "subdomain", True),
    "daemonsets": Kind("daemonsets", "DaemonSet", True, "subdomain", True, "apps/v1"),
    "clusterroles": Kind("clusterroles", "ClusterRole", False, "subdomain", False, _RBAC),
    "clusterrolebindings": Kind("clusterrolebindings", "ClusterRoleBinding", False, "subdomain", False, _RBAC),
    "validatingadmissionpolicies": Kind(
        "validatingadmissionpolicies", "ValidatingAdmissionPolicy", False, "subdomain", True, _ADMISSION
    ),
    "validatingadmissionpolicybindings": Kind(
        "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding", False, "subdomain", True, _ADMISSION
    ),
    "clusterpolicies": Kind("clusterpolicies", "ClusterPolicy", False, "subdomain", True, "nvidia.com/v1"),
}
KINDS.update(STORED_ONLY)
# Writers whose fields are not tracked (metadata.managedFields): the simulator's own controllers' hot paths.
_UNMANAGED = ("nodes", "pods")
DRA_PLURALS = ("resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates")


# Who an in-process caller (a test, the benchmark, the demo) is: kubeadm's administrator.
ADMIN_USER = "kubernetes-admin"


class ClusterApi:
    """kube-apiserver behaviour for one cluster. Callers hold `cluster.state.lock`. `user`: the requester's
    name, which admission (simcluster.admission) reads: the HTTP server passes gpuaas's ServiceAccount, the
    simulated controllers their own."""

    def __init__(self, cluster: Cluster, *, user: str = ADMIN_USER, manager: str = "", dry_run: bool = False):
        self.cluster = cluster
        self.user = user
        # The request's field manager (`fieldManager`, else from its User-Agent) and `dryRun=All`.
        self.manager = manager or user
        self.dry_run = dry_run
        self._managed: list[dict] | None = None  # an apply's managedFields, for the create or update it makes

    # --- helpers ----------------------------------------------------------------------

    def _store(self, plural: str) -> dict:
        return getattr(self.cluster, plural)

    def _key(self, kind: Kind, namespace: str | None, name: str):
        return (namespace, name) if kind.namespaced else name

    def _require_namespace(self, namespace: str) -> None:
        if namespace not in self.cluster.namespaces:
            raise not_found("namespaces", namespace)

    def _record(self, plural: str, namespace: str | None, name: str) -> Record:
        kind = KINDS[plural]
        record = self._store(plural).get(self._key(kind, namespace, name))
        if record is None:
            raise not_found(plural, name)
        return record

    def render(self, plural: str, record: Record) -> bytes:
        if plural == "resourcequotas":
            return _DUMPS(scheduler.render_quota(self.cluster, record.obj)).encode()
        if plural == kubevirt.PLURAL:  # status follows the launcher pod: computed on read
            return _DUMPS(kubevirt.render(self.cluster, record.obj)).encode()
        if record.raw is None:
            record.raw = _DUMPS(record.obj).encode()
        return record.raw

    def _node(self, name: str) -> Node:
        node = self.cluster.nodes.get(name)
        if node is None:
            raise not_found("nodes", name)
        return node

    # --- list -------------------------------------------------------------------------

    def list(self, plural: str, namespace: str | None, params: ListParams) -> bytes:
        """One page of a list. The first page of a paged list keeps the rest as a snapshot, so every
        continue page comes from the state at the first page's resourceVersion (as etcd serves it);
        a token older than the compacted history, or whose snapshot is gone, gets 410 Expired."""
        labels = parse_label_selector(params.label_selector)
        fields = parse_field_selector(plural, params.field_selector)
        cluster = self.cluster
        list_kind = "NodeList" if plural == "nodes" else KINDS[plural].kind + "List"
        api_version = "v1" if plural == "nodes" else KINDS[plural].api_version
        snapshot = None
        if params.continue_token:
            token = continue_fields(params.continue_token)
            if token["rv"] < cluster.compacted_rv or (token["snap"] and token["snap"] not in cluster.list_snapshots):
                raise expired_continue(cluster.rv, token["start"], token["page"])
            if token["snap"]:
                snapshot = token["snap"]
                rv, matched = cluster.list_snapshots[snapshot]
                cluster.list_snapshots.move_to_end(snapshot)
            else:  # the inconsistent continuation a 410 offers: the live state
                rv, matched = cluster.rv, self.matching(plural, namespace, labels, fields)
            keys = [k for k, _ in matched]
            matched = matched[bisect.bisect_right(keys, token["start"]) :]
            page = token["page"]
        else:
            self._check_list_rv(params)
            rv, matched, page = cluster.rv, self.matching(plural, namespace, labels, fields), 1
        limit = params.limit
        if not limit or len(matched) <= limit:
            return _list_bytes(list_kind, rv, [raw for _, raw in matched], None, page, None, api_version=api_version)
        if snapshot is None:
            snapshot = f"{rv}.{len(cluster.list_snapshots)}.{cluster.new_uid('snapshot')[:8]}"
            cluster.list_snapshots[snapshot] = (rv, matched[limit:])
            while len(cluster.list_snapshots) > cluster.state.api.list_snapshots:
                cluster.list_snapshots.popitem(last=False)
        items = matched[:limit]
        # Like kube-apiserver, remainingItemCount only when it is exact (no selectors).
        remaining = None if labels or fields else len(matched) - limit
        return _list_bytes(
            list_kind, rv, [raw for _, raw in items], items[-1][0], page, remaining, snapshot, api_version
        )

    def _check_list_rv(self, params: ListParams) -> None:
        """resourceVersion on a list: newer than the cluster's is 504 (kube-apiserver waits 3 s
        first); an Exact read of a past version is 410, as if compacted (no history is kept)."""
        wanted = params.start_rv()
        current = self.cluster.rv
        if wanted is None:
            return
        if wanted > current:
            raise ApiError(
                504,
                "Timeout",
                f"Timeout: Too large resource version: {wanted}, current: {current}",
                {
                    "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                    "retryAfterSeconds": 1,
                },
            )
        if params.resource_version_match == "Exact" and wanted != current:
            raise too_old(wanted, current)

    def matching(
        self, plural: str, namespace: str | None, labels: list[Requirement], fields
    ) -> list[tuple[str, bytes]]:
        """Every object of the kind (in the namespace) that the selectors match, as (key, JSON) in
        the etcd-like key order continue tokens refer to: node name, or "<namespace>/<name>"."""
        cluster = self.cluster
        if plural == "nodes":
            return [
                (node.name, node_json(cluster, node))
                for node in cluster.iter_nodes_from(None)
                if labels_match(labels, node.labels)
                and (
                    not fields
                    or fields_match(
                        fields, {"metadata": {"name": node.name}, "spec": {"unschedulable": node.unschedulable}}
                    )
                )
            ]
        store = self._store(plural)
        ordered = sorted(
            ("/".join(k) if isinstance(k, tuple) else k, k) for k in store if namespace is None or k[0] == namespace
        )
        return [
            (joined, self.render(plural, store[k]))
            for joined, k in ordered
            if labels_match(labels, store[k].obj["metadata"].get("labels") or {}) and fields_match(fields, store[k].obj)
        ]

    # --- watch ------------------------------------------------------------------------

    def watch_start(self, plural: str, namespace: str | None, params: ListParams) -> tuple[list[bytes], int]:
        """The first lines of a watch and the resourceVersion it continues from. Without a
        resourceVersion (or "0"), synthetic ADDED events for what exists now, as kube-apiserver sends."""
        labels = parse_label_selector(params.label_selector)
        fields = parse_field_selector(plural, params.field_selector)
        start = params.start_rv()
        if start is None:
            lines = [_event_line("ADDED", raw) for _, raw in self.matching(plural, namespace, labels, fields)]
            return lines, self.cluster.rv
        if start > self.cluster.rv:
            raise ApiError(504, "Timeout", f"Timeout: Too large resource version: {start}, current: {self.cluster.rv}")
        return [], start

    def watch_lines(
        self, plural: str, namespace: str | None, params: ListParams, since: int, promote: set
    ) -> tuple[list[bytes], int]:
        """Events after resourceVersion `since` that this watch sees, as JSON lines, and the
        resourceVersion now reached. 410 (too_old) when `since` is older than the kept history.

        A node's ADDED/MODIFIED event whose node changed again since is skipped (its later event
        follows); a skipped ADDED turns the next MODIFIED into ADDED (`promote` carries that
        across calls). Selectors filter on the event's object.
        """
        cluster = self.cluster
        if since < cluster.compacted_rv:
            raise too_old(since, cluster.rv)
        labels = parse_label_selector(params.label_selector)
        fields = parse_field_selector(plural, params.field_selector)
        fresh = []
        for event in reversed(cluster.watch_events):
            if event.rv <= since:
                break
            fresh.append(event)
        lines = []
        for event in reversed(fresh):
            if event.plural != plural or (namespace is not None and event.key[0] != namespace):
                continue
            if isinstance(event.source, Node):
                if event.source.resource_version != str(event.rv):
                    if event.type == "ADDED":
                        promote.add(event.key)
                    continue
                raw = node_json(cluster, event.source)
            else:
                raw = event.source
            obj = json.loads(raw)
            if not (labels_match(labels, obj["metadata"].get("labels") or {}) and fields_match(fields, obj)):
                continue
            kind = event.type
            if kind == "MODIFIED" and event.key in promote:
                kind = "ADDED"
            promote.discard(event.key)
            lines.append(_event_line(kind, raw))
        return lines, cluster.rv

    def bookmark(self, plural: str, rv: int) -> bytes:
        kind = "Node" if plural == "nodes" else KINDS[plural].kind
        api_version = "v1" if plural == "nodes" else KINDS[plural].api_version
        return _event_line(
            "BOOKMARK",
            _DUMPS({"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": str(rv)}}).encode(),
        )

    # --- get --------------------------------------------------------------------------

    def get(self, plural: str, namespace: str | None, name: str) -> bytes:
        if plural == "nodes":
            return node_json(self.cluster, self._node(name))
        return self.render(plural, self._record(plural, namespace, name))

    # --- create -----------------------------------------------------------------------

    def create(self, plural: str, namespace: str | None, body: object) -> tuple[int, bytes]:
        if plural == "nodes":
            raise ApiError(405, "MethodNotAllowed", "simcluster nodes come from the scenario; create is not allowed")
        kind = KINDS[plural]
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {}) or {}
        obj["metadata"] = meta
        if kind.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and body_ns != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
            self._require_namespace(namespace)
        name = meta.get("name")
        if not name and meta.get("generateName"):
            name = meta["generateName"] + self.cluster.new_uid("generate")[-5:]
            meta["name"] = name
        problems = name_problems(name, kind.name_rule)
        problems += label_problems(meta.get("labels")) + annotation_problems(meta.get("annotations"))
        problems += self._validate(plural, obj)
        if problems:
            raise invalid(kind.kind, str(name or ""), problems)
        admission.admit(self.cluster, self.user, "CREATE", plural, namespace, obj)
        store = self._store(plural)
        key = self._key(kind, namespace, name)
        if key in store:
            raise already_exists(plural, name)
        for drop in ("resourceVersion", "uid", "creationTimestamp", "deletionTimestamp", "selfLink"):
            meta.pop(drop, None)
        obj["kind"], obj["apiVersion"] = kind.kind, kind.api_version
        meta["uid"] = self.cluster.new_uid(plural, namespace, name)
        meta["creationTimestamp"] = self.cluster.state.timestamp()
        if plural == "namespaces":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = name
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
        elif plural == "pods" and not self.dry_run:
            scheduler.admit_pod(self.cluster, obj)
        elif plural in ("resourcequotas", "resourceclaims", kubevirt.PLURAL):
            obj.pop("status", None)
        self._set_managed_fields(plural, None, obj)
        if self.dry_run:
            return 201, self.render(plural, Record(obj))
        meta["resourceVersion"] = self.cluster.bump()
        record = Record(obj)
        store[key] = record
        self.cluster.record_event("ADDED", plural, key, self.render(plural, record))
        if plural == "pods":
            scheduler.on_pod_created(self.cluster, record)
        elif plural == kubevirt.PLURAL:
            kubevirt.on_created(self, record)
        elif plural == "configmaps":
            gpuoperator.on_configmap_changed(self.cluster, namespace, name)
        elif plural in ("deviceclasses", "resourceclaimtemplates") or (
            plural == "resourceclaims" and not meta.get("ownerReferences")
        ):
            scheduler.retry_pending(self.cluster)  # pods waiting for this template, class or claim
        return 201, self.render(plural, record)

    def _validate(self, plural: str, obj: dict) -> list[tuple[str, str]]:
        if plural == "configmaps":
            problems = []
            for section in ("data", "binaryData"):
                data = obj.get(section) or {}
                if not isinstance(data, dict):
                    problems.append((section, "Invalid value: must be a map"))
                    continue
                for k, v in data.items():
                    if not _CONFIG_KEY.match(k):
                        problems.append(
                            (
                                f"{section}[{k}]",
                                f'Invalid value: "{k}": a valid config key must consist '
                                "of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or "
                                "'KEY_NAME',  or 'key-name', regex used for validation is "
                                "'[-._a-zA-Z0-9]+')",
                            )
                        )
                    if section == "data" and not isinstance(v, str):
                        problems.append((f"data[{k}]", "Invalid value: must be a string"))
            return problems
        if plural == "resourcequotas":
            return scheduler.quota_problems(obj)
        if plural in DRA_PLURALS:
            return dra.validate(plural, obj)
        if plural == "poddisruptionbudgets":
            return disruption.validate(obj)
        if plural == kubevirt.PLURAL:
            return kubevirt.validate(obj)
        if plural == "priorityclasses":
            value = obj.get("value")
            if not isinstance(value, int) or isinstance(value, bool) or value > 1_000_000_000:
                return [("value", "Invalid value: must be an integer no greater than 1000000000")]
            return []
        if plural == "pods":
            containers = (obj.get("spec") or {}).get("containers")
            if not containers:
                return [("spec.containers", "Required value")]
            problems = []
            for i, c in enumerate(containers):
                if not isinstance(c, dict) or not c.get("name"):
                    problems.append((f"spec.containers[{i}].name", "Required value"))
                elif not c.get("image"):
                    problems.append((f"spec.containers[{i}].image", "Required value"))
            return problems
        return []

    # --- replace / patch --------------------------------------------------------------

    def replace(self, plural: str, namespace: str | None, name: str, body: object) -> bytes:
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        meta = body.get("metadata") or {}
        if meta.get("name") and meta["name"] != name:
            raise bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
        if plural == "nodes":
            return self._update_node(self._node(name), body)
        return self._update(plural, namespace, name, body)

    def patch(self, plural: str, namespace: str | None, name: str, body: object, content_type: str) -> bytes:
        """Patch the current object, then update with the result. The patched document carries the
        current resourceVersion unless the patch set one, so a stale one in a patch conflicts."""
        if plural == "nodes":
            node = self._node(name)
            return self._update_node(node, apply_patch(json.loads(node_json(self.cluster, node)), body, content_type))
        current = json.loads(self.render(plural, self._record(plural, namespace, name)))
        return self._update(plural, namespace, name, apply_patch(current, body, content_type))

    def _update(self, plural: str, namespace: str | None, name: str, new: dict) -> bytes:
        kind = KINDS[plural]
        record = self._record(plural, namespace, name)
        old = record.obj
        meta = new.get("metadata") or {}
        new["metadata"] = meta
        given_rv = meta.get("resourceVersion")
        if given_rv and str(given_rv) != old["metadata"]["resourceVersion"]:
            raise conflict(plural, name)
        if meta.get("name", name) != name:
            raise invalid(kind.kind, name, [("metadata.name", "Invalid value: field is immutable")])
        problems = label_problems(meta.get("labels")) + annotation_problems(meta.get("annotations"))
        problems += self._validate(plural, new)
        if plural == "pods" and _fixed_pod_spec(new.get("spec") or {}) != _fixed_pod_spec(old.get("spec") or {}):
            problems.append(
                (
                    "spec",
                    "Forbidden: pod updates may not change fields other than `spec.containers[*]."
                    "image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
                    "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
                    "(allow it to be set to 1 if it was previously negative)",
                )
            )
        if plural in ("resourceclaims", "resourceclaimtemplates") and new.get("spec") != old.get("spec"):
            problems.append(("spec", "Invalid value: field is immutable"))
        if problems:
            raise invalid(kind.kind, name, problems)
        admission.admit(self.cluster, self.user, "UPDATE", plural, namespace, new, old)
        # System-owned metadata and the status of namespaces/pods are kept from the stored object.
        for keep in ("uid", "creationTimestamp", "namespace", "name", "generateName"):
            if keep in old["metadata"]:
                meta[keep] = old["metadata"][keep]
        new["kind"], new["apiVersion"] = kind.kind, kind.api_version
        if plural == "namespaces":
            new["spec"] = old.get("spec")
        if plural in ("namespaces", "pods", "resourceclaims"):
            new["status"] = old.get("status")  # status belongs to the controllers (and the sim)
        if plural in ("resourcequotas", kubevirt.PLURAL):
            new.pop("status", None)  # computed on read
        self._set_managed_fields(plural, old, new)
        if self.dry_run:
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            return self.render(plural, Record(new))
        meta["resourceVersion"] = self.cluster.bump()
        record.obj = new
        record.raw = None
        self.cluster.record_event("MODIFIED", plural, self._key(kind, namespace, name), self.render(plural, record))
        if plural == "configmaps":
            gpuoperator.on_configmap_changed(self.cluster, namespace, name)
        return self.render(plural, record)

    def _set_managed_fields(self, plural: str, old: dict | None, new: dict) -> None:
        """metadata.managedFields after this write: an apply's own, else the writer's changes as "Update"."""
        meta = new["metadata"]
        if self._managed is not None:
            meta["managedFields"] = self._managed
        elif plural in _UNMANAGED:
            meta.pop("managedFields", None)
        else:
            at = self.cluster.state.timestamp()
            meta["managedFields"] = fieldmanager.record_update(old, new, self.manager, at, KINDS[plural].api_version)
        if not meta.get("managedFields", True):
            meta.pop("managedFields")

    def apply(self, plural: str, namespace: str | None, name: str, body: object, *, force: bool) -> tuple[int, bytes]:
        """Server-side apply (simcluster.fieldmanager): create the object when missing, else merge `body` into it
        as `self.manager`; 409 on another manager's field unless `force`. An apply that changes nothing writes
        nothing (same resourceVersion), as kube-apiserver answers it."""
        if plural == "nodes":
            raise ApiError(415, "UnsupportedMediaType", "simcluster does not server-side apply nodes; patch them")
        kind = KINDS[plural]
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be an object")
        if body.get("kind") != kind.kind or body.get("apiVersion") != kind.api_version:
            raise bad_request(
                f"apply of {body.get('apiVersion')}/{body.get('kind')} does not match {kind.api_version}/{kind.kind}"
            )
        meta = body.get("metadata") or {}
        if meta.get("name") != name:
            raise bad_request(f"the name of the object ({meta.get('name')}) does not match the URL's ({name})")
        if kind.namespaced and meta.get("namespace") not in (None, namespace):
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        record = self._store(plural).get(self._key(kind, namespace, name))
        current = copy.deepcopy(record.obj) if record is not None else None
        at = self.cluster.state.timestamp()
        merged, managed = fieldmanager.apply(
            current, body, self.manager, force=force, at=at, kind=kind.kind, api_version=kind.api_version
        )
        self._managed = managed
        if current is None:
            return self.create(plural, namespace, merged)
        before = current["metadata"].get("managedFields") or []
        if _without_managed(merged) == _without_managed(current) and _untimed(managed) == _untimed(before):
            return 200, self.render(plural, record)
        return 200, self._update(plural, namespace, name, merged)

    def _update_node(self, node: Node, new: dict) -> bytes:
        """Replace what a client may change on a node: labels, annotations, taints, unschedulable."""
        meta = new.get("metadata") or {}
        given_rv = meta.get("resourceVersion")
        if given_rv and str(given_rv) != node.resource_version:
            raise conflict("nodes", node.name)
        if meta.get("name", node.name) != node.name:
            raise invalid("Node", node.name, [("metadata.name", "Invalid value: field is immutable")])
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        spec = new.get("spec") or {}
        problems = label_problems(labels) + annotation_problems(annotations)
        taints = spec.get("taints") or []
        if not isinstance(taints, list) or not all(
            isinstance(t, dict) and t.get("key") and t.get("effect") in ("NoSchedule", "PreferNoSchedule", "NoExecute")
            for t in taints
        ):
            problems.append(
                (
                    "spec.taints",
                    "Invalid value: each taint needs a key and an effect of NoSchedule, PreferNoSchedule or NoExecute",
                )
            )
        unschedulable = spec.get("unschedulable") or False
        if not isinstance(unschedulable, bool):
            problems.append(("spec.unschedulable", "Invalid value: must be a boolean"))
        if problems:
            raise invalid("Node", node.name, problems)
        old_labels = dict(node.labels)
        node.labels = dict(labels)
        node.annotations = dict(annotations)
        node.taints = [dict(t) for t in taints]
        was_unschedulable = node.unschedulable
        node.unschedulable = unschedulable
        _sync_unschedulable_taint(node)
        self.cluster.touch(node)
        gpuoperator.on_node_labels_changed(self.cluster, node, old_labels)
        if was_unschedulable != node.unschedulable or old_labels != node.labels:
            scheduler.retry_pending(self.cluster)
        return node_json(self.cluster, node)

    # --- delete -----------------------------------------------------------------------

    def delete(self, plural: str, namespace: str | None, name: str, grace_s: int | None = None) -> bytes:
        """Delete an object. A running pod is deleted gracefully (see scheduler.terminate): it stays,
        Terminating, and the answer is the pod with its deletionTimestamp."""
        if plural == "nodes":
            node = self._node(name)
            body = node_json(self.cluster, node)
            self.cluster.state.faults.node_vanish(self.cluster.name, name)
            return body
        kind = KINDS[plural]
        key = self._key(kind, namespace, name)
        record = self._record(plural, namespace, name)
        admission.admit(self.cluster, self.user, "DELETE", plural, namespace, None, record.obj)
        if plural == "pods":
            if scheduler.terminate(self.cluster, record, grace_s):
                return self.render(plural, record)
            obj = copy.deepcopy(scheduler.remove_pod(self.cluster, key))
            obj["metadata"]["deletionTimestamp"] = self.cluster.state.timestamp()
            obj["metadata"]["deletionGracePeriodSeconds"] = 0
            return _DUMPS(obj).encode()
        if plural == "namespaces":
            self._delete_namespace_contents(name)
        obj = copy.deepcopy(record.obj)
        if plural == "namespaces":
            obj["metadata"]["deletionTimestamp"] = self.cluster.state.timestamp()
            obj["status"] = {"phase": "Terminating"}
        self._forget(plural, key)
        if plural == "configmaps":
            gpuoperator.on_configmap_changed(self.cluster, namespace, name)
        elif plural == kubevirt.PLURAL:
            kubevirt.on_deleted(self, obj)
        elif plural == "resourceclaims":
            scheduler.retry_pending(self.cluster)  # its devices are free again (a pod still running keeps its own)
        if kind.delete_returns_object:
            if plural == "resourcequotas":
                return _DUMPS(scheduler.render_quota(self.cluster, obj)).encode()
            return _DUMPS(obj).encode()
        return _DUMPS(success_status(plural, name, obj["metadata"]["uid"])).encode()

    def _forget(self, plural: str, key) -> None:
        """Remove a stored (non-pod) object for good and tell watchers, with its final JSON."""
        record = self._store(plural).pop(key)
        record.obj["metadata"]["resourceVersion"] = self.cluster.bump()
        record.raw = None
        self.cluster.record_event("DELETED", plural, key, self.render(plural, record))

    def _delete_namespace_contents(self, namespace: str) -> None:
        # kube-controller-manager's namespace controller empties it, through admission like any client.
        for key, record in list(self.cluster.resourceclaimtemplates.items()):
            if key[0] == namespace:
                admission.admit(
                    self.cluster, admission.NAMESPACE_CONTROLLER, "DELETE", "resourceclaimtemplates", namespace, None,
                    record.obj,
                )  # fmt: skip
        for plural in (
            "pods",
            "configmaps",
            "resourcequotas",
            "resourceclaims",
            "resourceclaimtemplates",
            kubevirt.PLURAL,
        ):
            for key in [k for k in self._store(plural) if k[0] == namespace]:
                if plural == "pods":
                    scheduler.remove_pod(self.cluster, key)
                else:
                    self._forget(plural, key)
                    if plural == "configmaps":
                        gpuoperator.on_configmap_changed(self.cluster, namespace, key[1])

    def evict(self, namespace: str, name: str, body: object) -> tuple[int, bytes]:
        """policy/v1 Eviction: the pod is deleted unless a PodDisruptionBudget forbids it now (429
        TooManyRequests, as kube-apiserver answers; simcluster.disruption). A 429 fault on the eviction path
        imitates one too."""
        self._require_namespace(namespace)
        record = self._record("pods", namespace, name)
        disruption.check_eviction(self.cluster, namespace, record.obj)
        options = (body or {}).get("deleteOptions") if isinstance(body, dict) else None
        grace = (options or {}).get("gracePeriodSeconds")
        self.delete("pods", namespace, name, None if grace is None else int(grace))
        return 201, _DUMPS(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        ).encode()


def _without_managed(obj: dict) -> dict:
    return {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "managedFields"}}


def _untimed(managed: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if k != "time"} for entry in managed]


def _fixed_pod_spec(spec: dict) -> dict:
    """The parts of a pod spec an update may not change: all but container images and
    activeDeadlineSeconds (tolerations additions are not modelled)."""
    fixed = copy.deepcopy(spec)
    fixed.pop("activeDeadlineSeconds", None)
    for group in ("containers", "initContainers"):
        for container in fixed.get(group) or []:
            if isinstance(container, dict):
                container.pop("image", None)
    return fixed


_UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def _sync_unschedulable_taint(node: Node) -> None:
    """The node lifecycle controller keeps this taint in step with spec.unschedulable."""
    has = any(t.get("key") == _UNSCHEDULABLE_TAINT for t in node.taints)
    if node.unschedulable and not has:
        node.taints.append({"key": _UNSCHEDULABLE_TAINT, "effect": "NoSchedule", "timeAdded": node.created})
    elif not node.unschedulable and has:
        node.taints = [t for t in node.taints if t.get("key") != _UNSCHEDULABLE_TAINT]

"""The OpenAPI documents kube-apiserver publishes, for the kinds this simulator serves.

kubectl needs them: `kubectl explain` reads the v3 schema of a kind, and `kubectl apply/create
--validate=strict` looks in the v3 document whether the kind's PATCH operation takes the
`fieldValidation` query parameter; if it does, kubectl sends `fieldValidation=Strict` and leaves the
check to the server (here: `unknown_fields`), else it downloads the v2 document as protobuf and
validates on the client. What is taken as fact from upstream (read, not copied):

- kubernetes/kube-openapi pkg/handler3/handler.go: `/openapi/v3` answers
  `{"paths": {"api/v1": {"serverRelativeURL": "/openapi/v3/api/v1?hash=<ETag>"}}}`, the ETag being
  the upper-case hex SHA-512 of the group-version's JSON; a request whose `hash` is stale is
  redirected (301) to the current one, a current one is served `Cache-Control: public, immutable`;
  an Accept it cannot serve gets 406. pkg/handler/handler.go serves `/openapi/v2` the same way.
- kubernetes/kubernetes staging/src/k8s.io/cli-runtime/pkg/resource/query_param_verifier_v3.go:
  the PATCH operation carrying `x-kubernetes-group-version-kind` and a `fieldValidation` parameter.
- kubernetes/kubernetes staging/src/k8s.io/client-go/discovery/discovery_client.go (kubectl 1.32,
  seen with `kubectl -v=7`): the v2 document is asked for only as
  `application/com.github.proto-openapi.spec.v2@v1.0+protobuf`, and only after v3 failed.
  This simulator serves v2 as JSON only (406 to a protobuf-only Accept), so kubectl stays on v3.
- api/openapi-spec/README.md: `x-kubernetes-group-version-kind` (a list on definitions, one object
  on operations) and `x-kubernetes-action`; kube-openapi pkg/util ToRESTFriendlyName: schema names
  are the Go package path with its domain reversed (io.k8s.api.core.v1.Node; a CRD's
  com.nvidia.v1.ClusterPolicy).

Kinds the simulator only stores keep `spec`/`status` open (`x-kubernetes-preserve-unknown-fields`),
so strict validation rejects only what is unknown in the parts described here.
"""

from __future__ import annotations

import hashlib
import json

_OPEN = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_STRING = {"type": "string"}
_STRINGS = {"type": "array", "items": _STRING}
_STRING_MAP = {"type": "object", "additionalProperties": _STRING}
_OPEN_LIST = {"type": "array", "items": _OPEN}
_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_OBJECT_META = {
    "description": "Standard object's metadata.",
    "type": "object",
    "properties": {
        "name": {**_STRING, "description": "Name must be unique within a namespace."},
        "generateName": _STRING,
        "namespace": {**_STRING, "description": "The namespace the object is in (namespaced kinds)."},
        "selfLink": _STRING,
        "uid": _STRING,
        "resourceVersion": _STRING,
        "generation": {"type": "integer", "format": "int64"},
        "creationTimestamp": {"type": "string", "format": "date-time"},
        "deletionTimestamp": {"type": "string", "format": "date-time"},
        "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
        "labels": {**_STRING_MAP, "description": "Map of string keys and values to organize and select objects."},
        "annotations": _STRING_MAP,
        "ownerReferences": _OPEN_LIST,
        "finalizers": _STRINGS,
        "managedFields": _OPEN_LIST,
    },
}
_TAINT = {
    "type": "object",
    "required": ["key", "effect"],
    "properties": {
        "key": _STRING,
        "value": _STRING,
        "effect": {**_STRING, "description": "NoSchedule, PreferNoSchedule or NoExecute."},
        "timeAdded": {"type": "string", "format": "date-time"},
    },
}
# The fields described per kind (beyond apiVersion, kind, metadata); other kinds get open spec/status.
_FIELDS = {
    "Node": {
        "spec": {
            "description": "Behaviour of the node: its taints and whether new pods may be scheduled on it.",
            "type": "object",
            "properties": {
                "podCIDR": _STRING,
                "podCIDRs": _STRINGS,
                "providerID": _STRING,
                "unschedulable": {"type": "boolean", "description": "Cordoned: no new pods are scheduled here."},
                "taints": {"type": "array", "items": _TAINT},
                "configSource": _OPEN,
                "externalID": _STRING,
            },
        },
        "status": {
            "description": "Most recently observed status of the node (capacity, conditions, node info).",
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {
                "capacity": _STRING_MAP,
                "allocatable": _STRING_MAP,
                "conditions": _OPEN_LIST,
                "addresses": _OPEN_LIST,
                "nodeInfo": _OPEN,
            },
        },
    },
    "ConfigMap": {
        "data": {**_STRING_MAP, "description": "Configuration data (UTF-8 values)."},
        "binaryData": {"type": "object", "additionalProperties": {"type": "string", "format": "byte"}},
        "immutable": {"type": "boolean"},
    },
    "Namespace": {
        "spec": {"type": "object", "properties": {"finalizers": _STRINGS}},
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {"phase": _STRING}},
    },
    "Pod": {
        "spec": {
            "description": "Specification of the desired behaviour of the pod.",
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {
                "containers": _OPEN_LIST,
                "nodeName": _STRING,
                "nodeSelector": _STRING_MAP,
                "tolerations": _OPEN_LIST,
                "priorityClassName": _STRING,
                "resourceClaims": _OPEN_LIST,
            },
        },
        "status": _OPEN,
    },
}
# Query parameters of the write operations (kube-apiserver's names).
_WRITE_PARAMS = ("dryRun", "fieldManager", "fieldValidation")
_PATCH_PARAMS = (*_WRITE_PARAMS, "force")


def schema_name(group: str, version: str, kind: str) -> str:
    """The components/definitions key kube-apiserver uses for a kind."""
    if not group:
        return f"io.k8s.api.core.{version}.{kind}"
    if group.endswith(".k8s.io") or "." not in group:  # built-in groups live in k8s.io/api/<group>
        return f"io.k8s.api.{group.split('.')[0]}.{version}.{kind}"
    return f"{'.'.join(reversed(group.split('.')))}.{version}.{kind}"


def kind_schema(group: str, version: str, kind: str, ref_prefix: str) -> dict:
    """The schema of one kind; `ref_prefix` is `#/components/schemas/` (v3) or `#/definitions/` (v2)."""
    api_version = f"{group}/{version}" if group else version
    fields = _FIELDS.get(kind, {"spec": _OPEN, "status": _OPEN})
    return {
        "description": f"{kind} ({api_version}) as this simulator serves it.",
        "type": "object",
        "properties": {
            "apiVersion": {**_STRING, "description": "The versioned schema of this representation of an object."},
            "kind": {**_STRING, "description": "The REST resource this object represents."},
            "metadata": {
                "description": "Standard object's metadata.",
                "allOf": [{"$ref": ref_prefix + _META}],
                "default": {},
            },
            **fields,
        },
        "x-kubernetes-group-version-kind": [{"group": group, "kind": kind, "version": version}],
    }


def _operation(action: str, gvk: dict, ref: str, params: tuple[str, ...], v3: bool) -> dict:
    parameters = [
        {"name": p, "in": "query", "schema": _STRING} if v3 else {"name": p, "in": "query", "type": "string"}
        for p in params
    ]
    ok = (
        {"description": "OK", "content": {"application/json": {"schema": {"$ref": ref}}}}
        if v3
        else {
            "description": "OK",
            "schema": {"$ref": ref},
        }
    )
    return {
        "operationId": f"{action}{gvk['kind']}",
        "parameters": parameters,
        "responses": {"200": ok},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk,
    }


def _paths(group_version: str, resources: list[dict], ref_prefix: str, v3: bool) -> dict:
    group, _, version = group_version.rpartition("/")
    base = f"/apis/{group_version}" if group else f"/api/{version}"
    paths = {}
    for res in resources:
        if "/" in res["name"]:
            continue  # subresources (pods/eviction) are not described
        gvk = {"group": group, "version": version, "kind": res["kind"]}
        ref = ref_prefix + schema_name(group, version, res["kind"])
        prefix = f"{base}/namespaces/{{namespace}}" if res["namespaced"] else base
        verbs = set(res["verbs"])
        collection = {"get": _operation("list", gvk, ref, (), v3)}
        if "create" in verbs:
            collection["post"] = _operation("post", gvk, ref, _WRITE_PARAMS, v3)
        item = {"get": _operation("get", gvk, ref, (), v3)}
        if "update" in verbs:
            item["put"] = _operation("put", gvk, ref, _WRITE_PARAMS, v3)
        if "patch" in verbs:
            item["patch"] = _operation("patch", gvk, ref, _PATCH_PARAMS, v3)
        if "delete" in verbs:
            item["delete"] = _operation("delete", gvk, ref, ("dryRun", "gracePeriodSeconds"), v3)
        paths[f"{prefix}/{res['name']}"] = collection
        paths[f"{prefix}/{res['name']}/{{name}}"] = item
    return paths


def _schemas(group_version: str, resources: list[dict], ref_prefix: str) -> dict:
    group, _, version = group_version.rpartition("/")
    schemas = {_META: _OBJECT_META}
    for res in resources:
        if "/" not in res["name"]:
            schemas[schema_name(group, version, res["kind"])] = kind_schema(group, version, res["kind"], ref_prefix)
    return schemas


def v3_document(group_version: str, resources: list[dict]) -> dict:
    """The OpenAPI 3.0 document of one group-version (/openapi/v3/api/v1, /openapi/v3/apis/<g>/<v>)."""
    prefix = "#/components/schemas/"
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (simcluster)", "version": "unversioned"},
        "paths": _paths(group_version, resources, prefix, v3=True),
        "components": {"schemas": _schemas(group_version, resources, prefix)},
    }


def v2_document(resource_lists: dict[str, list[dict]]) -> dict:
    """The Swagger 2.0 document of every served group-version (/openapi/v2)."""
    prefix = "#/definitions/"
    paths, definitions = {}, {}
    for group_version, resources in resource_lists.items():
        paths.update(_paths(group_version, resources, prefix, v3=False))
        definitions.update(_schemas(group_version, resources, prefix))
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes (simcluster)", "version": "unversioned"},
        "paths": paths,
        "definitions": definitions,
    }


def encode(document: dict) -> tuple[bytes, str]:
    """A document's JSON bytes and its ETag (upper-case hex SHA-512, as kube-openapi computes it)."""
    body = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
    return body, hashlib.sha512(body).hexdigest().upper()


def v3_discovery(etags: dict[str, str]) -> dict:
    """/openapi/v3: each group-version's path (no leading slash) -> its URL with the current hash."""
    return {"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={etag}"} for gv, etag in etags.items()}}


def unknown_fields(obj: object, group: str, version: str, kind: str) -> list[str]:
    """Dotted paths of the fields in `obj` its kind's schema does not declare (fieldValidation=Strict)."""
    schemas = {_META: _OBJECT_META}
    root = kind_schema(group, version, kind, "")
    found: list[str] = []
    _walk(obj, root, "", schemas, found)
    return found


def _walk(value: object, schema: dict, path: str, schemas: dict, found: list[str]) -> None:
    if "allOf" in schema:
        schema = schemas[schema["allOf"][0]["$ref"]]
    if isinstance(value, dict):
        if "additionalProperties" in schema:
            for key, item in value.items():
                _walk(item, schema["additionalProperties"], f"{path}.{key}" if path else key, schemas, found)
            return
        properties = schema.get("properties")
        for key, item in value.items():
            child = f"{path}.{key}" if path else key
            if key.startswith("$"):  # strategic-merge-patch directives ($patch, $setElementOrder/...)
                continue
            if properties is not None and key in properties:
                _walk(item, properties[key], child, schemas, found)
            elif properties is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                found.append(child)
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            _walk(item, schema["items"], f"{path}[{index}]", schemas, found)

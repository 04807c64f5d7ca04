"""RBAC in the simulated API server: what each request asks for, a ClusterRole's answer, and a request log.

Every /api and /apis request is resolved into the attributes kube-apiserver's authorizer sees (verb,
API group, resource, subresource, namespace, name), following RequestInfoFactory in
k8s.io/apiserver/pkg/endpoints/request/requestinfo.go: GET on a collection is `list` (`watch` with
?watch=true), GET on an object `get`, POST `create`, PUT `update`, PATCH `patch`, DELETE `delete`
(`deletecollection` on a collection); `/namespaces/{ns}/{resource}/{name}/{subresource}`.
Discovery paths (/version, /api, /apis, /api/v1) are non-resource URLs, which every authenticated
user may read (the system:discovery ClusterRole): they are neither logged nor checked.

Two knobs on `SimState.api` (simcluster.state.ApiBehaviour):
- `role`: a `Role` (a ClusterRole's rules); when set, a request it does not allow gets 403 Forbidden
  in the real Status shape and message (k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go).
- `on_request`: called with each request's `Access` and User-Agent (a recorder).
`RECORDERS` (module level) are called for every server in the process: the test suite's recording
plugin (tests/conftest.py, GPUAAS_RECORD_K8S_REQUESTS) uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import kube

DEFAULT_USER = "system:serviceaccount:gpuaas:gpuaas-controller"
# The namespace subresources kube-apiserver knows: /namespaces/{name}/status is not a resource "status".
_NAMESPACE_SUBRESOURCES = {"status", "finalize"}
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


@dataclass(frozen=True, slots=True)
class Access:
    """One request as the authorizer sees it. `namespaced`: the request names a namespace (a list of
    pods in all namespaces is not namespaced, so only a ClusterRole binding can allow it)."""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespaced: bool = False
    namespace: str = ""
    name: str = ""

    @property
    def rule_resource(self) -> str:
        """The resource as an RBAC rule names it: `pods`, or `pods/eviction` for a subresource."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    @property
    def key(self) -> tuple[str, str, str]:
        """(group, resource[/subresource], verb): the granularity a rule grants at."""
        return (self.group, self.rule_resource, self.verb)


def access_of(method: str, path: str, query: dict) -> Access | None:
    """The request's attributes, or None for a non-resource path (discovery, /healthz, /version)."""
    parts = [p for p in path.strip("/").split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if method == "GET":
        watch = (query.get("watch") or [""])[-1].lower() in ("1", "true")
        verb = "watch" if watch else ("get" if name else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = _VERBS.get(method, method.lower())
    namespaced = bool(namespace) and resource != "namespaces"
    return Access(verb, group, resource, subresource, namespaced, namespace if namespaced else "", name)


@dataclass(frozen=True)
class Rule:
    api_groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]
    resource_names: frozenset[str] = frozenset()

    def allows(self, access: Access) -> bool:
        return (
            ("*" in self.api_groups or access.group in self.api_groups)
            and ("*" in self.resources or access.rule_resource in self.resources)
            and ("*" in self.verbs or access.verb in self.verbs)
            and (not self.resource_names or access.name in self.resource_names)
        )


class Role:
    """A ClusterRole's rules (no aggregation, no non-resource URLs: gpuaas's role needs neither)."""

    def __init__(self, rules: Iterable[dict], *, name: str = "", user: str = DEFAULT_USER):
        self.name = name
        self.user = user
        self.rules = [
            Rule(
                frozenset(rule.get("apiGroups") or ()),
                frozenset(rule.get("resources") or ()),
                frozenset(rule.get("verbs") or ()),
                frozenset(rule.get("resourceNames") or ()),
            )
            for rule in rules
        ]

    @classmethod
    def from_manifest(cls, path: str | Path, **kwargs) -> Role:
        """The ClusterRole in a YAML file (the first document of kind ClusterRole)."""
        for doc in yaml.safe_load_all(Path(path).read_text()):
            if doc and doc.get("kind") == "ClusterRole":
                return cls(doc.get("rules") or (), name=doc["metadata"]["name"], **kwargs)
        raise ValueError(f"{path}: no ClusterRole in this file")

    def allows(self, access: Access) -> bool:
        return any(rule.allows(access) for rule in self.rules)

    def grants(self) -> set[tuple[str, str, str]]:
        """Every (group, resource, verb) the rules name explicitly (wildcards are not expanded)."""
        return {(g, r, v) for rule in self.rules for g in rule.api_groups for r in rule.resources for v in rule.verbs}

    def forbidden(self, access: Access) -> kube.ApiError:
        """403 as kube-apiserver words it (responsewriters.ForbiddenStatusError)."""
        subject = f'{access.resource} "{access.name}"' if access.name else access.resource
        where = f'in the namespace "{access.namespace}"' if access.namespace else "at the cluster scope"
        message = (
            f'{subject} is forbidden: User "{self.user}" cannot {access.verb} resource "{access.rule_resource}"'
            f' in API group "{access.group}" {where}'
        )
        details = {"kind": access.resource, **({"name": access.name} if access.name else {})}
        if access.group:
            details["group"] = access.group
        return kube.ApiError(403, "Forbidden", message, details)


# Called for every resource request of every server in this process: (access, user_agent).
RECORDERS: list[Callable[[Access, str], None]] = []


def authorize(api, access: Access | None, user_agent: str) -> None:
    """Log the request to the recorders, then raise 403 if `api.role` is set and does not allow it."""
    if access is None:
        return
    for record in (*RECORDERS, *((api.on_request,) if api.on_request else ())):
        record(access, user_agent)
    if api.role is not None and not api.role.allows(access):
        raise api.role.forbidden(access)


def compare(role: Role, used: Iterable[tuple[str, str, str]]) -> tuple[set, set]:
    """(used but not granted, granted but never used), as (group, resource, verb) sets."""
    used = set(used)
    return {key for key in used if not role.allows(_access(key))}, role.grants() - used


def _access(key: tuple[str, str, str]) -> Access:
    group, resource, verb = key
    base, _, sub = resource.partition("/")
    return Access(verb, group, base, sub)


def advice(missing: set, unused: set, where: str) -> str:
    """What to change in the ClusterRole file, one line per (group, resource, verb)."""
    lines = [
        f'{where}: add verb "{v}" on resource "{r}" in apiGroups ["{g}"] (used, not granted)'
        for g, r, v in sorted(missing)
    ]
    lines += [
        f'{where}: remove verb "{v}" on resource "{r}" in apiGroups ["{g}"] (granted, never used)'
        for g, r, v in sorted(unused)
    ]
    return "\n".join(lines)

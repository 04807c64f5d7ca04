"""gpuaas's ValidatingAdmissionPolicies (deploy/admission-policy.yaml, the DRA claims policy, and
deploy/admission-policy-borrowed.yaml, the borrowed-pods policy) as kube-apiserver applies them: the shipped
manifests are read and their CEL evaluated as written, through the CEL library behind simcluster/cel.py.

Knob: `ClusterSettings.admission_policy = True` (scenario key `admission_policy: true`; the "dra" scenario sets
it, as a cluster installed by docs/deploying.md has it). Then every create, update and delete of an object the
policy's `matchConstraints.resourceRules` name (and the binding's `matchResources`, when it has any) runs its
`variables` and `validations` with kube-apiserver's variables: `object` and `oldObject` (null on CREATE and
DELETE respectively), `request` (kind, resource, name, namespace, operation, `userInfo.username` and
`groups`), `namespaceObject` and `params` (null: the policies have no paramKind); the binding's
`matchResources.namespaceSelector` is matched against the namespace's labels (the borrowed-pods policy binds to
namespaces labelled gpuaas.io/borrowing=only). What the policies say is all the simulator enforces; nothing
about claims, templates or borrowed pods is written here in Python.

Validating admission runs after the object's own validation, so a malformed object still gets its 422 first.
The refusal has kube-apiserver's shape (k8s.io/apiserver pkg/admission/plugin/policy/validating/dispatcher.go):
the message "ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>" wrapped
by admission.NewForbidden (`<resource>.<group> "<name>" is forbidden: ...`), the reason and code from the
validation's `reason` (Forbidden -> 403; none or Invalid -> 422) and the message again as the one cause. A
validation that fails to evaluate is a denial under `failurePolicy: Fail`, with the message
"expression '<expression>' resulted in error: <error>" (reason Invalid, 422), as cel-go's evaluation error
reads in k8s.io/apiserver pkg/admission/plugin/cel/filter.go.

Who the requester is: the HTTP server's one token is gpuaas's ServiceAccount (rbac.DEFAULT_USER); in-process
callers pass their own user (kube.ADMIN_USER by default); the simulated resourceclaim controller creates
claims as CLAIM_CONTROLLER and the namespace deletion empties a namespace as NAMESPACE_CONTROLLER.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import cel

MANIFEST = Path(__file__).resolve().parents[1] / "deploy" / "admission-policy.yaml"
# The borrowed-units policy: in a namespace labelled gpuaas.io/borrowing=only, a GPU pod needs the borrowed
# PriorityClass (docs/queue.md, Borrowing). Evaluated as written, like the one above.
BORROWED_MANIFEST = MANIFEST.parent / "admission-policy-borrowed.yaml"
# kube-controller-manager's controllers, each with its own ServiceAccount (--use-service-account-credentials).
CLAIM_CONTROLLER = "system:serviceaccount:kube-system:resource-claim-controller"
NAMESPACE_CONTROLLER = "system:serviceaccount:kube-system:namespace-controller"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
_VARIABLE_USE = re.compile(r"\bvariables\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")
_CODES = {"Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413, "Invalid": 422}


@dataclass(frozen=True, slots=True)
class Rule:
    groups: tuple[str, ...]
    versions: tuple[str, ...]
    operations: tuple[str, ...]
    resources: tuple[str, ...]

    def matches(self, group: str, version: str, operation: str, resource: str) -> bool:
        return (
            _has(self.groups, group)
            and _has(self.versions, version)
            and _has(self.operations, operation)
            and _has(self.resources, resource)
        )


@dataclass(frozen=True, slots=True)
class Validation:
    expression: str
    message: str
    reason: str


@dataclass(frozen=True, slots=True)
class Policy:
    """One ValidatingAdmissionPolicy and its binding, as the manifest says."""

    name: str
    binding: str
    failure_policy: str
    rules: tuple[Rule, ...]
    variables: tuple[tuple[str, str], ...]
    validations: tuple[Validation, ...]
    namespace_selector: dict | None
    object_selector: dict | None
    actions: tuple[str, ...]

    def matches(self, group: str, version: str, operation: str, resource: str) -> bool:
        return any(r.matches(group, version, operation, resource) for r in self.rules)


def _has(allowed: tuple[str, ...], value: str) -> bool:
    return "*" in allowed or value in allowed


def parse(documents: list[dict]) -> Policy:
    """The policy and binding of a manifest; every expression is compiled here, so a policy the library cannot
    compile fails loudly when it is loaded, never silently at a request."""
    by_kind = {doc["kind"]: doc for doc in documents if doc}
    policy, binding = by_kind["ValidatingAdmissionPolicy"], by_kind["ValidatingAdmissionPolicyBinding"]
    spec, bspec = policy["spec"], binding["spec"]
    if spec.get("paramKind") or bspec.get("paramRef"):
        raise ValueError("simcluster does not evaluate policies with parameters")
    if bspec["policyName"] != policy["metadata"]["name"]:
        raise ValueError("the binding names another policy")
    constraints = spec.get("matchConstraints") or {}
    rules = tuple(
        Rule(
            tuple(r.get("apiGroups") or ()),
            tuple(r.get("apiVersions") or ()),
            tuple(r.get("operations") or ()),
            tuple(r.get("resources") or ()),
        )
        for r in constraints.get("resourceRules") or ()
    )
    variables = tuple((v["name"], v["expression"]) for v in spec.get("variables") or ())
    validations = tuple(
        Validation(v["expression"], v.get("message") or f"failed expression: {v['expression']}", v.get("reason", ""))
        for v in spec.get("validations") or ()
    )
    for expression in [e for _, e in variables] + [v.expression for v in validations]:
        cel.program(expression)
    match = bspec.get("matchResources") or {}
    return Policy(
        name=policy["metadata"]["name"],
        binding=binding["metadata"]["name"],
        failure_policy=spec.get("failurePolicy", "Fail"),
        rules=rules,
        variables=variables,
        validations=validations,
        namespace_selector=match.get("namespaceSelector") or constraints.get("namespaceSelector"),
        object_selector=match.get("objectSelector") or constraints.get("objectSelector"),
        actions=tuple(bspec.get("validationActions") or ()),
    )


@functools.cache
def load(manifest: Path) -> Policy:
    """A policy manifest of deploy/, read once per process from the source tree (the image leaves deploy/ out:
    a simulated cluster with the policies on runs from a checkout, as `make demo` and the tests do)."""
    if not manifest.exists():
        raise RuntimeError(f"admission_policy needs {manifest} (a source checkout): it is not there")
    return parse(list(yaml.safe_load_all(manifest.read_text())))


def shipped() -> Policy:
    """deploy/admission-policy.yaml: the DRA claims policy."""
    return load(MANIFEST)


def borrowed() -> Policy:
    """deploy/admission-policy-borrowed.yaml: the borrowed-pods policy."""
    return load(BORROWED_MANIFEST)


def policies() -> tuple[Policy, ...]:
    """Every policy deploy/ ships, in the order kube-apiserver's answer names the first that denies."""
    return (shipped(), borrowed())


def selects(selector: dict | None, labels: dict) -> bool:
    """A metav1.LabelSelector (matchLabels, matchExpressions) against labels; an empty or absent one selects all."""
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or ():
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or ()
        present = key in labels
        if (
            (operator == "In" and (not present or labels[key] not in values))
            or (operator == "NotIn" and present and labels[key] in values)
            or (operator == "Exists" and not present)
            or (operator == "DoesNotExist" and present)
        ):
            return False
    return True


def _labels(obj: dict | None) -> dict:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def decide(
    policy: Policy,
    *,
    user: str,
    operation: str,
    group: str,
    version: str,
    kind: str,
    plural: str,
    namespace: str | None,
    name: str,
    obj: dict | None,
    old: dict | None,
    namespace_obj: dict | None,
) -> Validation | None:
    """The validation that denies this request (a failed evaluation comes back as a Validation with the error as
    its message, reason Invalid), or None when the policy does not match it or admits it."""
    if not policy.matches(group, version, operation, plural) or "Deny" not in policy.actions:
        return None
    if namespace and not selects(policy.namespace_selector, _labels(namespace_obj)):
        return None
    if not selects(policy.object_selector, _labels(obj)) and not selects(policy.object_selector, _labels(old)):
        return None
    gvk = {"group": group, "version": version, "kind": kind}
    activation = {
        "object": obj,
        "oldObject": old,
        "params": None,
        "namespaceObject": namespace_obj,
        "request": {
            "uid": "",
            "kind": gvk,
            "resource": {"group": group, "version": version, "resource": plural},
            "subResource": "",
            "requestKind": gvk,
            "requestResource": {"group": group, "version": version, "resource": plural},
            "name": name,
            "namespace": namespace or "",
            "operation": operation,
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "dryRun": False,
        },
    }
    values, errors = {}, {}
    for variable, expression in policy.variables:
        try:
            values[variable] = cel.evaluate(expression, activation | {"variables": values})
        except cel.EvalError as exc:
            errors[variable] = f"expression '{expression}' resulted in error: {exc}"
    activation["variables"] = values
    for validation in policy.validations:
        failed = [errors[v] for v in _VARIABLE_USE.findall(validation.expression) if v in errors]
        if not failed:
            try:
                if cel.evaluate(validation.expression, activation) is True:
                    continue
                return validation
            except cel.EvalError as exc:
                failed = [f"expression '{validation.expression}' resulted in error: {exc}"]
        if policy.failure_policy == "Fail":
            return Validation(validation.expression, failed[0], "Invalid")
    return None


def admit(
    cluster, user: str, operation: str, plural: str, namespace: str | None, obj: dict | None, old: dict | None = None
) -> None:
    """Raise kube-apiserver's refusal if a shipped policy denies this request; return otherwise."""
    from .kube import KINDS

    kind = KINDS.get(plural)
    if not cluster.settings.admission_policy or kind is None:
        return
    group, _, version = kind.api_version.rpartition("/")
    for policy in policies():
        if policy.matches(group, version, operation, plural):
            _admit(cluster, policy, user, operation, group, version, kind, plural, namespace, obj, old)


def _admit(cluster, policy, user, operation, group, version, kind, plural, namespace, obj, old) -> None:
    from .kube import ApiError

    ns = cluster.namespaces.get(namespace or "")
    name = ((obj or old or {}).get("metadata") or {}).get("name") or ""
    denied = decide(
        policy,
        user=user,
        operation=operation,
        group=group,
        version=version,
        kind=kind.kind,
        plural=plural,
        namespace=namespace,
        name=name,
        obj=obj,
        old=old,
        namespace_obj=ns.obj if ns is not None else None,
    )
    if denied is None:
        return
    cause = f"ValidatingAdmissionPolicy '{policy.name}' with binding '{policy.binding}' denied request: "
    cause += denied.message
    reason = denied.reason or "Invalid"
    resource = f"{plural}.{group}" if group else plural
    raise ApiError(
        _CODES.get(reason, 422),
        reason,
        f'{resource} "{name}" is forbidden: {cause}',
        {"name": name, "group": group, "kind": plural, "causes": [{"message": cause}]},
    )

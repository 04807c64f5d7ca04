"""gpuaas's ValidatingAdmissionPolicy (deploy/admission-policy.yaml) as kube-apiserver applies it.

Knob: `ClusterSettings.admission_policy = True` (scenario key `admission_policy: true`; the "dra" scenario sets
it, as a cluster installed by docs/deploying.md has it). Then, in a namespace labelled
app.kubernetes.io/managed-by=gpuaas, a CREATE or UPDATE of a ResourceClaimTemplate by anyone but gpuaas's
ServiceAccount, and a CREATE of a ResourceClaim that the resourceclaim controller did not make from a pod's
template reference (its user, the pod-claim-name annotation, a controller ownerReference to a Pod), is refused.

Validating admission runs after the object's own validation, so a malformed object still gets its 422 first.
The refusal has kube-apiserver's shape (k8s.io/apiserver pkg/admission/plugin/policy/validating: the message
"ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>" wrapped by
admission.NewForbidden, and the code from the validation's reason: Forbidden -> 403, none/Invalid -> 422).
The rules are written here once more in Python (the simulator has no full CEL); tests/deploy checks they match
the manifest's.
"""

from __future__ import annotations

POLICY = "gpuaas-dra-claims"
BINDING = "gpuaas-dra-claims"
GROUP = "resource.k8s.io"
NAMESPACE_LABELS = {"app.kubernetes.io/managed-by": "gpuaas"}
TEMPLATE_WRITER = "system:serviceaccount:gpuaas:gpuaas-controller"  # deploy/serviceaccounts.yaml; rbac.DEFAULT_USER
CLAIM_CONTROLLER = "system:serviceaccount:kube-system:resource-claim-controller"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
# The operations each resource is matched for (spec.matchConstraints.resourceRules).
OPERATIONS = {"resourceclaimtemplates": {"CREATE", "UPDATE"}, "resourceclaims": {"CREATE"}}
MESSAGES = {
    "resourceclaimtemplates": "ResourceClaimTemplates in a gpuaas project namespace are written by gpuaas only; "
    "reference your pool's claim_template",
    "resourceclaims": "ResourceClaims in a gpuaas project namespace are made from a pod's resourceClaimTemplateName "
    "only; reference your pool's claim_template",
}


def _admitted(plural: str, user: str, obj: dict) -> bool:
    if plural == "resourceclaimtemplates":
        return user == TEMPLATE_WRITER
    meta = obj.get("metadata") or {}
    return (
        user == CLAIM_CONTROLLER
        and POD_CLAIM_NAME_ANNOTATION in (meta.get("annotations") or {})
        and any(
            o.get("apiVersion") == "v1" and o.get("kind") == "Pod" and o.get("controller")
            for o in meta.get("ownerReferences") or ()
        )
    )


def admit(cluster, user: str, operation: str, plural: str, namespace: str | None, obj: dict) -> None:
    """Raise the policy's refusal if it matches the request and denies it; return otherwise."""
    from .kube import ApiError

    if not cluster.settings.admission_policy or operation not in OPERATIONS.get(plural, ()):
        return
    ns = cluster.namespaces.get(namespace or "")
    labels = ((ns.obj.get("metadata") or {}).get("labels") or {}) if ns is not None else {}
    if any(labels.get(k) != v for k, v in NAMESPACE_LABELS.items()) or _admitted(plural, user, obj):
        return
    name = (obj.get("metadata") or {}).get("name") or ""
    message = (
        f"{plural}.{GROUP} \"{name}\" is forbidden: ValidatingAdmissionPolicy '{POLICY}' with binding "
        f"'{BINDING}' denied request: {MESSAGES[plural]}"
    )
    raise ApiError(403, "Forbidden", message, {"name": name, "group": GROUP, "kind": plural})

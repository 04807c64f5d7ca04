"""Onboarding a registered cluster: install gpuaas's node agent, its RBAC and admission policies into it.

The objects are deploy/'s own manifests, read from the files `kubectl apply -k deploy/` applies (never a copy
in code): the namespaces, gpuaas's ClusterRole and ServiceAccounts with their binding, the node agent's
ConfigMap (AGENT_CLUSTER_NAME set to the cluster's registered name) and DaemonSet (its image as
deploy/kustomization.yaml's `images` sets it, as kustomize would), and both ValidatingAdmissionPolicies with
their bindings. The control plane's own Deployments are not for managed clusters and are left out.

It needs credentials that may create RBAC and admission policies (a cluster administrator's kubeconfig):
gpuaas-controller's own role grants none of it. Its requests carry the User-Agent gpuaas-onboarding.

Every object goes in by server-side apply as field manager `gpuaas` (capacity.adapters.kubernetes.apply):
- `plan_onboarding` is the diff: per object, what is there now and what a dry-run apply (dryRun=All) answers,
  compared field by field: create, change (with the fields), or unchanged. Nothing is written anywhere.
- `onboard_cluster` dry-runs every object first (a refusal, such as a field another manager owns, stops it
  before anything is written), then applies them in order and records one ClusterOnboarding row (the audit)
  when it has ended. Applying twice changes nothing the second time: server-side apply of the same
  configuration is a no-op, so every object reports unchanged.
A conflict (409: another field manager owns a field with another value) is refused unless `force`, which
takes those fields over (https://kubernetes.io/docs/reference/using-api/server-side-apply/#conflicts).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..adapters import kubernetes as kube
from ..choices import OnboardingStatus
from ..models import Cluster, ClusterOnboarding

DEPLOY_DIR = Path(settings.BASE_DIR) / "deploy"
# (file, names to take or None for every object), in apply order: namespaces before what lives in them,
# the ClusterRole before its binding, the ConfigMap and ServiceAccount before the DaemonSet that uses them,
# each policy before its binding.
ONBOARD_MANIFESTS: tuple[tuple[str, frozenset[str] | None], ...] = (
    ("namespace.yaml", None),
    ("clusterrole.yaml", None),
    ("serviceaccounts.yaml", None),
    ("configmap.yaml", frozenset({"gpuaas-agent-config"})),
    ("node-agent.yaml", None),
    ("admission-policy.yaml", None),
    ("admission-policy-borrowed.yaml", None),
)
AGENT_CONFIG = "gpuaas-agent-config"
# What the API server sets on every object: not part of the diff.
_SERVER_META = {"uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink"}


class OnboardingError(Exception):
    """The cluster refused or could not be asked; the message says which object and why. `status`: the cluster's
    HTTP status (409: a field another manager owns), None when there was no answer. `credentials`: the cluster's
    registered kubeconfig cannot be used (fix the registration, not the cluster)."""

    def __init__(self, message: str, *, status: int | None = None, credentials: bool = False):
        super().__init__(message)
        self.status = status
        self.credentials = credentials


@dataclass(frozen=True, slots=True)
class FieldChange:
    path: str
    before: object
    after: object


@dataclass(slots=True)
class ObjectChange:
    """What applying one object does (or did): create, change (with the fields) or unchanged."""

    kind: str
    namespace: str
    name: str
    action: str
    fields: list[FieldChange] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "action": self.action,
            "fields": [{"path": f.path, "before": f.before, "after": f.after} for f in self.fields],
        }


def _kustomize_images() -> dict[str, str]:
    """deploy/kustomization.yaml's image overrides, name -> newName:newTag (kustomize's images transformer)."""
    data = yaml.safe_load((DEPLOY_DIR / "kustomization.yaml").read_text()) or {}
    out = {}
    for image in data.get("images") or ():
        name = image["name"]
        new = image.get("newName", name)
        if image.get("digest"):
            out[name] = f"{new}@{image['digest']}"
        else:
            out[name] = f"{new}:{image['newTag']}" if image.get("newTag") else new
    return out


def _set_images(obj: dict, images: dict[str, str]) -> None:
    spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in (*(spec.get("containers") or ()), *(spec.get("initContainers") or ())):
        name = container.get("image", "").split("@")[0].rsplit(":", 1)[0]
        if name in images:
            container["image"] = images[name]


def onboarding_objects(cluster: Cluster) -> list[dict]:
    """The objects onboarding applies to `cluster`, read from deploy/ (see the module doc), in apply order."""
    images = _kustomize_images()
    objects = []
    for filename, names in ONBOARD_MANIFESTS:
        path = DEPLOY_DIR / filename
        if not path.exists():
            raise OnboardingError(f"{path} is missing: onboarding applies deploy/'s manifests, ship them")
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or (names is not None and doc["metadata"]["name"] not in names):
                continue
            obj = copy.deepcopy(doc)
            if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == AGENT_CONFIG:
                obj["data"]["AGENT_CLUSTER_NAME"] = cluster.name
            _set_images(obj, images)
            objects.append(obj)
    return objects


def _comparable(obj: dict | None) -> dict:
    if obj is None:
        return {}
    out = {k: v for k, v in obj.items() if k != "status"}
    out["metadata"] = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in _SERVER_META}
    return out


def field_changes(before: dict | None, after: dict, prefix: str = "") -> list[FieldChange]:
    """The fields that differ between two objects, as dotted paths (maps compared key by key, lists whole)."""
    changes = []
    for key in sorted(set(before or {}) | set(after)):
        old, new = (before or {}).get(key), after.get(key)
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(new, dict) and new and (old is None or isinstance(old, dict)):
            changes += field_changes(old, new, path)
        elif old != new:
            changes.append(FieldChange(path, old, new))
    return changes


def _describe(obj: dict, current: dict | None, answer: dict) -> ObjectChange:
    meta = obj["metadata"]
    change = ObjectChange(obj["kind"], meta.get("namespace", ""), meta["name"], "unchanged")
    if current is None:
        change.action = "create"
        change.fields = field_changes(None, _comparable(answer))
    else:
        change.fields = field_changes(_comparable(current), _comparable(answer))
        if change.fields:
            change.action = "change"
    return change


def _label(obj: dict) -> str:
    meta = obj["metadata"]
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj['kind']} {where}{meta['name']}"


def _dry_run(client, objects: list[dict], force: bool) -> list[ObjectChange]:
    """Each object's change by dry-run apply. An object in a namespace the plan creates cannot be dry-run (the API
    server answers NotFound for the namespace, as it persists nothing): it is a create of the manifest as is."""
    changes = []
    new_namespaces: set[str] = set()
    for obj in objects:
        if obj["metadata"].get("namespace") in new_namespaces:
            changes.append(_describe(obj, None, obj))
            continue
        try:
            current = client.read_object(obj)
            answer = client.apply_object(obj, force=force, dry_run=True)
        except kube.KubernetesError as exc:
            raise OnboardingError(f"{_label(obj)}: {exc}", status=exc.status) from None
        changes.append(_describe(obj, current, answer))
        if obj["kind"] == "Namespace" and current is None:
            new_namespaces.add(obj["metadata"]["name"])
    return changes


def _client(cluster: Cluster, client):
    if client is not None:
        return client
    try:
        return kube.KubernetesClient.for_cluster(cluster, user_agent=kube.ONBOARDING_USER_AGENT)
    except kube.KubernetesError as exc:
        raise OnboardingError(
            f"cluster {cluster.name}: its kubeconfig cannot be used: {exc}", status=exc.status, credentials=True
        ) from None


def plan_onboarding(cluster: Cluster, *, force: bool = False, client=None) -> list[ObjectChange]:
    """The diff onboarding would apply, per object (dry-run apply; nothing is written, in the cluster or here).

    OnboardingError when the cluster cannot be asked or refuses an object (the message names it)."""
    objects = onboarding_objects(cluster)
    own = client is None
    client = _client(cluster, client)
    try:
        return _dry_run(client, objects, force)
    finally:
        if own:
            client.close()


def onboard_cluster(cluster: Cluster, *, actor=None, force: bool = False, client=None) -> ClusterOnboarding:
    """Apply the onboarding objects into `cluster` (server-side apply, field manager gpuaas) and record it.

    Idempotent: a second run applies the same configuration and every object is unchanged. Every object is
    dry-run first, so a refusal (a conflict without `force`, an invalid object, no permission) writes nothing in
    the cluster and nothing here: OnboardingError. A failure while applying (the cluster went away half way)
    records a failed ClusterOnboarding naming the objects the cluster took and the error, then raises
    OnboardingError; running it again finishes the job. No lock: concurrent runs apply the same objects.
    """
    objects = onboarding_objects(cluster)
    own = client is None
    client = _client(cluster, client)
    started = timezone.now()
    done: list[ObjectChange] = []
    try:
        _dry_run(client, objects, force)
        for obj in objects:
            try:
                current = client.read_object(obj)
                answer = client.apply_object(obj, force=force)
            except kube.KubernetesError as exc:
                message = f"{_label(obj)}: {exc}"
                _record(cluster, actor, force, started, done, OnboardingStatus.FAILED, message)
                raise OnboardingError(message, status=exc.status) from None
            done.append(_describe(obj, current, answer))
    finally:
        if own:
            client.close()
    row = _record(cluster, actor, force, started, done, OnboardingStatus.APPLIED, "")
    row.changes = done  # with the field diffs, for the caller to show (the row keeps the actions)
    return row


def _record(cluster, actor, force, started, done, status, error) -> ClusterOnboarding:
    with transaction.atomic():
        return ClusterOnboarding.objects.create(
            cluster=cluster,
            actor=actor if getattr(actor, "pk", None) else None,
            status=status,
            force=force,
            objects_applied=[{k: v for k, v in c.as_dict().items() if k != "fields"} for c in done],
            error=error[:4000],
            started_at=started,
            finished_at=timezone.now(),
        )

"""Namespaced objects gpuaas owns: namespaces (with a node selector), resource quotas and ConfigMaps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import Conflict
from .objects import NODE_SELECTOR_ANNOTATION
from .transport import MERGE_PATCH, Transport


def _object(kind: str, namespace: str, name: str, *, labels=None, resource_version: str = "", **content) -> dict:
    """A v1 object's body: metadata (labels, and a resourceVersion to replace only that version) and `content`."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = labels
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": "v1", "kind": kind, "metadata": meta, **content}


def _quota_spec(hard: dict[str, str]) -> dict[str, Any]:
    return {"hard": {k: str(v) for k, v in hard.items()}}


def _namespace_meta(labels, annotations, node_selector: str | None) -> dict[str, Any]:
    """Labels and annotations of a namespace; node_selector sets its node-selector annotation when given."""
    annotations = dict(annotations or {})
    if node_selector is not None:
        annotations[NODE_SELECTOR_ANNOTATION] = node_selector
    meta: dict[str, Any] = {}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return meta


def _create_or_update(create: Callable[..., dict], update: Callable[..., dict], *args, **kwargs) -> dict:
    """Create the object, or update it with the same arguments when it exists (idempotent)."""
    try:
        return create(*args, **kwargs)
    except Conflict:
        return update(*args, **kwargs)


class NamespaceCalls(Transport):
    # --- configmaps ---------------------------------------------------------------------

    def get_config_map(self, namespace: str, name: str) -> dict:
        return self._call(self.core.read_namespaced_config_map, name, namespace)

    def create_config_map(
        self, namespace: str, name: str, data: dict[str, str], *, labels: dict[str, str] | None = None
    ) -> dict:
        body = _object("ConfigMap", namespace, name, labels=labels, data=data)
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
        body = _object("ConfigMap", namespace, name, labels=labels, resource_version=resource_version, data=data)
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
        return _create_or_update(self.create_config_map, self.replace_config_map, namespace, name, data, labels=labels)

    def delete_config_map(self, namespace: str, name: str) -> None:
        self._call(self.core.delete_namespaced_config_map, name, namespace)

    # --- resource quotas ----------------------------------------------------------------

    def get_resource_quota(self, namespace: str, name: str) -> dict:
        return self._call(self.core.read_namespaced_resource_quota, name, namespace)

    def create_resource_quota(
        self, namespace: str, name: str, hard: dict[str, str], *, labels: dict[str, str] | None = None
    ) -> dict:
        body = _object("ResourceQuota", namespace, name, labels=labels, spec=_quota_spec(hard))
        return self._call(self.core.create_namespaced_resource_quota, namespace, body)

    def replace_resource_quota(
        self, namespace: str, name: str, hard: dict[str, str], *, labels: dict[str, str] | None = None
    ) -> dict:
        body = _object("ResourceQuota", namespace, name, labels=labels, spec=_quota_spec(hard))
        return self._call(self.core.replace_namespaced_resource_quota, name, namespace, body)

    def apply_resource_quota(
        self, namespace: str, name: str, hard: dict[str, str], *, labels: dict[str, str] | None = None
    ) -> dict:
        """Create the quota, or replace its hard limits when it exists (idempotent)."""
        return _create_or_update(
            self.create_resource_quota, self.replace_resource_quota, namespace, name, hard, labels=labels
        )

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
        meta = {"name": name, **_namespace_meta(labels, annotations, node_selector)}
        return self._call(self.core.create_namespace, {"apiVersion": "v1", "kind": "Namespace", "metadata": meta})

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
        meta = _namespace_meta(labels, annotations, node_selector)
        return self._call(self.core.patch_namespace, name, {"metadata": meta}, _content_type=MERGE_PATCH)

    def ensure_namespace(self, name: str, **fields) -> dict:
        """Create the namespace, or merge the labels/annotations into the existing one (idempotent).

        `fields` are create_namespace's keywords: labels, annotations, node_selector.
        """
        return _create_or_update(self.create_namespace, self.patch_namespace, name, **fields)

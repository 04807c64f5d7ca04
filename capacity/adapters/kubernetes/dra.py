"""Dynamic Resource Allocation (resource.k8s.io/v1, GA in Kubernetes 1.34): the driver's ResourceSlices, the
ResourceClaims pods hold, and the ResourceClaimTemplates gpuaas writes per pool (docs/dra.md).

Through the official client's ResourceV1Api. A cluster that does not serve resource.k8s.io/v1 answers
404 (NotFound) to every call here: callers take that as "no DRA".
"""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s

from .objects import DraDevice, ResourceClaim, parse_resource_claim, parse_resource_slice
from .transport import Transport

API_VERSION = "resource.k8s.io/v1"


class DraCalls(Transport):
    @property
    def resource(self) -> k8s.ResourceV1Api:
        api = getattr(self, "_resource_api", None)
        if api is None:
            api = self._resource_api = k8s.ResourceV1Api(self.api_client)
        return api

    def list_dra_devices(self, driver: str = "") -> list[DraDevice]:
        """Every device of every ResourceSlice (of one driver when given). NotFound: DRA not served."""
        kwargs = {"field_selector": f"spec.driver={driver}"} if driver else {}
        return [d for obj in self._list(self.resource.list_resource_slice, **kwargs) for d in parse_resource_slice(obj)]

    def list_resource_claims(self, namespace: str = "") -> list[ResourceClaim]:
        if namespace:
            items = self._list(self.resource.list_namespaced_resource_claim, namespace)
        else:
            items = self._list(self.resource.list_resource_claim_for_all_namespaces)
        return [parse_resource_claim(obj) for obj in items]

    # --- claim templates (gpuaas's, per pool and unit kind) --------------------------------------

    def list_resource_claim_templates(self, namespace: str, *, label_selector: str = "") -> list[dict]:
        kwargs = {"label_selector": label_selector} if label_selector else {}
        return self._list(self.resource.list_namespaced_resource_claim_template, namespace, **kwargs)

    def create_resource_claim_template(
        self, namespace: str, name: str, spec: dict[str, Any], *, labels: dict[str, str] | None = None
    ) -> dict:
        body = {
            "apiVersion": API_VERSION,
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace, **({"labels": labels} if labels else {})},
            "spec": spec,
        }
        return self._call(self.resource.create_namespaced_resource_claim_template, namespace, body)

    def delete_resource_claim_template(self, namespace: str, name: str) -> None:
        self._call(self.resource.delete_namespaced_resource_claim_template, name, namespace)

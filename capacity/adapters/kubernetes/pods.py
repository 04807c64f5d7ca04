"""Pods: the workloads on the GPUs (listing, eviction through the Eviction API, deletion; creation for the demo's
teams, gpuaas itself never starts a workload)."""

from __future__ import annotations

from typing import Any

from .objects import Pod, parse_pod
from .transport import Transport


class PodCalls(Transport):
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

    def create_pod(self, namespace: str, body: dict) -> Pod:
        """Create a pod from a manifest (what a team's `kubectl apply` does; the demo seeds its teams' pods so)."""
        return parse_pod(self._call(self.core.create_namespaced_pod, namespace, body))

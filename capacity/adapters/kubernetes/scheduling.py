"""PriorityClasses (scheduling.k8s.io/v1): the low priority gpuaas gives borrowed units' pods (docs/queue.md)."""

from __future__ import annotations

from kubernetes import client as k8s

from .errors import Conflict
from .transport import Transport


class SchedulingCalls(Transport):
    @property
    def scheduling(self) -> k8s.SchedulingV1Api:
        api = getattr(self, "_scheduling_api", None)
        if api is None:
            api = self._scheduling_api = k8s.SchedulingV1Api(self.api_client)
        return api

    def ensure_priority_class(
        self, name: str, value: int, *, description: str = "", labels: dict[str, str] | None = None
    ) -> bool:
        """Create the PriorityClass if missing; True when created. Its value is immutable in Kubernetes,
        so an existing class is left as it is."""
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name, **({"labels": labels} if labels else {})},
            "value": value,
            "globalDefault": False,
            "preemptionPolicy": "Never",
            "description": description,
        }
        try:
            self._call(self.scheduling.create_priority_class, body)
        except Conflict:
            return False
        return True

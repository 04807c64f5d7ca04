"""Nodes: the GPU Operator's and gpuaas's labels and annotations, and cordoning."""

from __future__ import annotations

from .objects import Node, parse_node
from .transport import MERGE_PATCH, Transport


class NodeCalls(Transport):
    def list_nodes(self, label_selector: str = "") -> list[Node]:
        kwargs = {"label_selector": label_selector} if label_selector else {}
        return [parse_node(obj) for obj in self._list(self.core.list_node, **kwargs)]

    def get_node(self, name: str) -> Node:
        return parse_node(self._call(self.core.read_node, name))

    def patch_node(self, name: str, body: dict) -> Node:
        """JSON merge patch of a node (a None value removes a key)."""
        return parse_node(self._call(self.core.patch_node, name, body, _content_type=MERGE_PATCH))

    def patch_node_labels(self, name: str, labels: dict[str, str | None]) -> Node:
        """Set labels; a None value removes that label."""
        return self.patch_node(name, {"metadata": {"labels": labels}})

    def patch_node_annotations(self, name: str, annotations: dict[str, str | None]) -> Node:
        return self.patch_node(name, {"metadata": {"annotations": annotations}})

    def set_node_taint(self, node: Node, key: str, value: str | None, effect: str = "NoSchedule") -> Node | None:
        """Make `node` carry the taint `key`=`value`:`effect` (None: carry no `key` taint); None when it already did.

        A merge patch replaces spec.taints whole, so the list is rebuilt from `node` (as read) with
        every other taint kept."""
        kept = [t for t in node.taints if t.get("key") != key]
        wanted = kept + ([{"key": key, "value": value, "effect": effect}] if value is not None else [])
        if wanted == node.taints:
            return None
        return self.patch_node(node.name, {"spec": {"taints": wanted}})

    def cordon(self, name: str) -> Node:
        return self.patch_node(name, {"spec": {"unschedulable": True}})

    def uncordon(self, name: str) -> Node:
        return self.patch_node(name, {"spec": {"unschedulable": None}})

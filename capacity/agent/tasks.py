"""Celery tasks a node agent serves on its node's queue (node.<cluster>.<node>). No database here.

Registered through CELERY_IMPORTS (the agent's module is not an app's `tasks`). Each task takes
names and the poll slot, does its NVML work and hands the result to the control plane.
"""

from __future__ import annotations

from celery import current_app, shared_task

from core.leases import crash_point

from . import node, transport


@shared_task(acks_late=True)
def read_node_metrics_task(cluster: str, node_name: str, api_url: str, slot: int) -> int:
    """Read this node's GPUs and publish the signed report on the ingest queue; returns GPUs read."""
    report = node.read_metrics(cluster, node_name, api_url=api_url, slot=slot)
    crash_point("agent.read")
    transport.publish(report)
    return len(report["body"]["gpus"])


@shared_task(acks_late=True)
def read_node_inventory_task(cluster: str, node_name: str, api_url: str) -> int:
    """Read this node's NVML inventory and publish the signed report on the ingest queue; returns GPUs read."""
    report = node.read_inventory(cluster, node_name, api_url=api_url)
    transport.publish(report)
    inventory = report["body"]["inventory"]
    return 0 if inventory is None else len(inventory["gpus"])


# The control plane's task that records a MIG result (operations.tasks); sent by name: no import upward.
MIG_RESULT_TASK = "operations.tasks.mig_result_task"


@shared_task(acks_late=True)
def apply_mig_task(command: dict, api_url: str) -> str:
    """Carry out a signed MIG command on this node and send the signed result to the control plane.

    A command that is not this node's is refused (raises: nothing applied, nothing sent)."""
    result = node.apply_mig(command, api_url=api_url)
    crash_point("agent.mig")  # fault tests: applied, result not sent (the control plane re-sends the command)
    current_app.send_task(MIG_RESULT_TASK, args=[result])
    return result["body"]["error"] or "applied"

"""What a node agent does for its node: read NVML and the kubelet's PodResources, sign the result. No database.

The control plane's embedded path (`monitoring.services.collect.poll_node`) calls the same functions
in-process, so a reading takes one path whether it crossed the broker or not.
"""

from __future__ import annotations

import time

from django.conf import settings

from capacity.adapters import nvml, podresources
from capacity.mig.catalog import get_product

from . import protocol


def read_metrics(cluster: str, node: str, *, api_url: str, slot: int) -> dict:
    """One signed metrics report of `node` for poll slot `slot` (epoch seconds).

    An NVML failure is reported too (body.error), so the control plane records the failed poll. The kubelet's
    PodResources `List` is read too (one local call) and only its fingerprint sent (body.pods): the control plane
    learns within one poll that a pod started or stopped on a GPU of this node (monitoring.services.reports).
    """
    started = time.monotonic()
    readings, error = None, ""
    try:
        readings = nvml.node_metrics(api_url, node, gpm_interval_s=settings.MONITORING_GPM_INTERVAL_MS / 1000)
    except nvml.NvmlError as exc:
        error = str(exc)
    pods = podresources.pods_digest(podresources.read_node(api_url, node, allocatable=False))
    elapsed_ms = int((time.monotonic() - started) * 1000)
    body = protocol.metrics_body(readings, error=error, elapsed_ms=elapsed_ms, pods=pods)
    return protocol.sign(protocol.KIND_METRICS, cluster, node, slot, body)


def read_inventory(cluster: str, node: str, *, api_url: str) -> dict:
    """One signed inventory report of `node` (GPUs, MIG devices with placements, processes) with the kubelet's
    PodResources answer (which pod holds which device; its failures are part of the report, never raised).

    The slot is the read's time (epoch seconds): inventories are not periodic; it dates the report.
    """
    slot = int(time.time())
    try:
        inventory, error = nvml.node_inventory(api_url, node), ""
    except nvml.NvmlError as exc:
        inventory, error = None, str(exc)
    held = podresources.read_node(api_url, node)
    body = protocol.inventory_body(inventory, error=error, pod_resources=held)
    return protocol.sign(protocol.KIND_INVENTORY, cluster, node, slot, body)


def apply_mig(command: dict, *, api_url: str) -> dict:
    """Carry out a signed MIG command addressed to this node; the signed result (what NVML did, the error, the
    inventory read back afterwards). BadReport if the command is not signed with this node's key.

    Each GPU is set to its target layout (re-entrant: instances already in place are kept), so a redelivered
    command changes nothing the first delivery already did.
    """
    protocol.verify(command, own=True)
    if command["kind"] != protocol.KIND_MIG_COMMAND:
        raise protocol.BadReport(f"kind {command['kind']!r} is not a MIG command")
    command_id, product_name, gpus = protocol.mig_command_from_body(command["body"])
    cluster, node = command["cluster"], command["node"]
    applied: dict[str, dict] = {}
    error = ""
    try:
        product = get_product(product_name)
        with nvml.session(api_url, node) as session:
            for index, gpu in sorted(gpus.items(), key=lambda item: int(item[0])):
                wanted = [(product.profile(p["profile"]), int(p["start"])) for p in gpu["placements"]]
                applied[index] = nvml.apply_gpu_layout(
                    session, int(index), product, mig_enabled=bool(gpu["mig"]), instances=wanted
                )
    except (nvml.NvmlError, nvml.LayoutError) as exc:
        error = f"NVML: {exc}"
    except (KeyError, ValueError) as exc:  # a product or profile this agent's catalog does not know
        error = f"{type(exc).__name__}: {exc}"
    inventory = read_inventory(cluster, node, api_url=api_url)
    body = protocol.mig_result_body(command_id, applied=applied, error=error, inventory=inventory)
    return protocol.sign(protocol.KIND_MIG_RESULT, cluster, node, int(time.time()), body)

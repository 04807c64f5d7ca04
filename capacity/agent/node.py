"""What a node agent does for its node: read NVML, sign the result. No database, no models.

The control plane's embedded path (`monitoring.services.collect.poll_node`) calls the same functions
in-process, so a reading takes one path whether it crossed the broker or not.
"""

from __future__ import annotations

import time

from django.conf import settings

from capacity.adapters import nvml

from . import protocol


def read_metrics(cluster: str, node: str, *, api_url: str, slot: int) -> dict:
    """One signed metrics report of `node` for poll slot `slot` (epoch seconds).

    An NVML failure is reported too (body.error), so the control plane records the failed poll.
    """
    started = time.monotonic()
    readings, error = None, ""
    try:
        readings = nvml.node_metrics(api_url, node, gpm_interval_s=settings.MONITORING_GPM_INTERVAL_MS / 1000)
    except nvml.NvmlError as exc:
        error = str(exc)
    body = protocol.metrics_body(readings, error=error, elapsed_ms=int((time.monotonic() - started) * 1000))
    return protocol.sign(protocol.KIND_METRICS, cluster, node, slot, body)


def read_inventory(cluster: str, node: str, *, api_url: str) -> dict:
    """One signed inventory report of `node` (GPUs, MIG devices with placements, processes).

    The slot is the read's time (epoch seconds): inventories are not periodic; it dates the report.
    """
    slot = int(time.time())
    try:
        body = protocol.inventory_body(nvml.node_inventory(api_url, node))
    except nvml.NvmlError as exc:
        body = protocol.inventory_body(None, error=str(exc))
    return protocol.sign(protocol.KIND_INVENTORY, cluster, node, slot, body)

"""GpuCapacity.health, written for the monitoring app: its health events decide the value, capacity
owns the row. "lost" belongs to the inventory (a GPU off the bus) and is never overwritten here.
"""

from __future__ import annotations

from capacity.choices import GpuHealth
from capacity.models import GpuCapacity


def set_gpu_health(gpu_id: int, health: str) -> bool:
    """Set the GPU's health unless it is lost or has that health already; True when it changed.

    One conditional UPDATE, no lock: concurrent writers of the same value change it once.
    """
    changed = GpuCapacity.objects.filter(pk=gpu_id).exclude(health__in=[GpuHealth.LOST, health]).update(health=health)
    return changed == 1

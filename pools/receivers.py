"""pools' answers to what capacity announces (capacity/signals.py), connected in PoolsConfig.ready()."""

from __future__ import annotations

from .services import enqueue_queue_processing, rehome_allocations


def rehome_gone_instances(sender, *, instance_ids, at, **kwargs) -> None:
    """MIG instances are gone: move each active allocation on them to a replacement, or end it, in the
    inventory's transaction (pools.services.rehome_allocations)."""
    rehome_allocations(list(instance_ids), at=at)


def queue_pass_on_capacity(sender, **kwargs) -> None:
    """Units may have come free: the queue gets a pass after commit."""
    enqueue_queue_processing()

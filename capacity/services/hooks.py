"""What capacity tells the layers above when the hardware changes under them.

Capacity must not import pools, yet when discovery finds a MIG instance gone, the allocation on it
has to move or end in the same transaction (an active allocation on a destroyed instance would go
on being billed). The upper layer registers its handler at start-up (PoolsConfig.ready()), as
monitoring registers the pool card's utilisation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

InstancesGone = Callable[..., object]
_instances_gone: list[InstancesGone] = []
CapacityAppeared = Callable[[], object]
_capacity_appeared: list[CapacityAppeared] = []


def on_instances_gone(handler: InstancesGone) -> None:
    """Call `handler(instance_ids, at=...)` whenever MIG instances are found gone (idempotent registration)."""
    if handler not in _instances_gone:
        _instances_gone.append(handler)


def instances_gone(instance_ids: Iterable[int], *, at: datetime) -> None:
    """Tell every registered handler; runs inside the caller's transaction (the inventory's)."""
    ids = sorted(set(instance_ids))
    if not ids:
        return
    for handler in _instances_gone:
        handler(ids, at=at)


def on_capacity_appeared(handler: CapacityAppeared) -> None:
    """Call `handler()` whenever units may have come free under the pools (idempotent registration)."""
    if handler not in _capacity_appeared:
        _capacity_appeared.append(handler)


def capacity_appeared() -> None:
    """A node is back (listed again, Ready again, uncordoned): tell every registered handler, inside the
    caller's transaction (pools enqueues a queue pass after commit)."""
    for handler in _capacity_appeared:
        handler()

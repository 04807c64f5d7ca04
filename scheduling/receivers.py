"""scheduling's answers to what pools announces (pools/signals.py), connected in SchedulingConfig.ready()."""

from __future__ import annotations

from . import queue
from .tasks import process_queue_task


def run_queue_pass(sender, **kwargs) -> None:
    """Units may have come free: the queue gets a pass after commit (pools.services.enqueue_queue_processing)."""
    process_queue_task.delay_on_commit()


def approve_or_queue_submitted(sender, *, request, **kwargs) -> None:
    """A request was just submitted: approved by policy, queued, or left for an operator (queue.after_submit)."""
    queue.after_submit(request)

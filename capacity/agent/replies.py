"""The control plane's side of what a node agent sends back besides its reports (those go through the ingest
transport): a MIG command's signed result. Runs on the control plane's default queue, never on a node's.

capacity only announces the result (capacity.signals.mig_result_reported); operations, which sent the
command, connects to it and records it, so nothing is sent by name across the layers.
"""

from __future__ import annotations

from celery import shared_task

from capacity import signals


# The wire name of earlier releases, when the task lived in operations.tasks: results already queued when the
# control plane is upgraded are still read.
@shared_task(name="operations.tasks.mig_result_task", acks_late=True)
def mig_result_task(report: dict) -> str:
    """Control plane: a node agent's signed MIG result. capacity only announces it (capacity.signals
    mig_result_reported); operations, which sent the command, checks and stores it. Its answer is returned."""
    answers = signals.mig_result_reported.send(sender=mig_result_task, report=report)
    return str(answers[0][1]) if answers else "refused: nothing records MIG results here"

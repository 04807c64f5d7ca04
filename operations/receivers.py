"""operations' answers to what capacity announces (capacity/signals.py), connected in OperationsConfig.ready()."""

from __future__ import annotations

from .reconfiguration.commands import record_result


def record_mig_result(sender, *, report, **kwargs) -> str:
    """A node agent's signed MIG result reached the control plane: check it against the reconfiguration whose
    command it answers and store it; "recorded", "duplicate" or "refused: why" (the task's result)."""
    return record_result(report)

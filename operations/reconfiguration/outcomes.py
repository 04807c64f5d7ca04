"""What a step or an operation on a reconfiguration can end in: an error, or a step's result."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.api import DomainConflict


class ReconfigurationError(Exception):
    """A step failed; the reconfiguration stops in state failed with this message."""

    def __init__(self, message: str, detail: dict | None = None):
        super().__init__(message)
        self.detail = detail or {}


class Refused(ReconfigurationError):
    """The check refused: allocated GPUs without drain, or outside a maintenance window without force."""


class IllegalTransition(DomainConflict):
    """The operation does not apply in the current state (API: 409)."""


@dataclass
class Advance:
    """A step finished: store `updates`, go to the next step (or `jump` to a later one)."""

    message: str
    detail: dict = field(default_factory=dict)
    updates: dict = field(default_factory=dict)
    jump: str | None = None


@dataclass
class Wait:
    """A step must check again later (re-enqueued with a countdown until the step's deadline).

    `countdown`: seconds to the next check when the step knows (a notice deadline); else the poll interval."""

    message: str
    detail: dict = field(default_factory=dict)
    countdown: int | None = None

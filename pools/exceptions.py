"""Domain errors of the pools workflow: each is a DomainConflict, which the API answers as a 409."""

from __future__ import annotations

from core.api import DomainConflict


class DomainError(DomainConflict):
    """A request the workflow refuses in its current state (HTTP 409 with `detail`, core.api)."""


class IllegalTransition(DomainError):
    """The request is not in a state from which `to_state` may be reached."""

    def __init__(self, request_id: int, from_state: str, to_state: str):
        super().__init__(
            f"Pool request #{request_id} is {from_state}; it cannot become {to_state}.",
            detail={"state": from_state, "to_state": to_state},
        )
        self.from_state = from_state
        self.to_state = to_state


class InsufficientCapacity(DomainError):
    """Not enough free units on any one cluster; `detail` says what is missing and what would help."""


class SpecError(ValueError):
    """A request's declared needs cannot be mapped to a spec; `errors` maps field -> message."""

    def __init__(self, errors: dict[str, str | list[str]]):
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


class LendingRefused(DomainError):
    """A unit that may not be lent (opted out, released, already lent, or to its own project)."""

"""Helpers shared by the billing tests (not a test module)."""

from __future__ import annotations

from datetime import UTC, date, datetime


def at(text: str) -> datetime:
    """Parse "2026-03-10 10:30" as UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def month(text: str) -> date:
    """Parse "2026-03" as date(2026, 3, 1)."""
    year, mon = text.split("-")
    return date(int(year), int(mon), 1)


def transition(request, from_state: str, to_state: str, when: str) -> None:
    """Record a request state change at a given time, as pools.services.transition would."""
    from pools.models import PoolRequest, PoolRequestTransition

    PoolRequestTransition.objects.create(request=request, from_state=from_state, to_state=to_state, at=at(when))
    PoolRequest.objects.filter(pk=request.pk).update(state=to_state)

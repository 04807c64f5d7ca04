"""The pool card's utilisation column, supplied by the layer that measures it.

Utilisation is monitoring's data and monitoring sits above pools, so pools does not read it: the
monitoring app registers its expression at start-up (MonitoringConfig.ready(), monitoring/cards.py).
Until one is registered the column is null, which the card shows as "not measured".
"""

from __future__ import annotations

from collections.abc import Callable

from django.db.models import Expression, FloatField, Value

_utilisation: Callable[[], Expression] | None = None


def register_utilisation(factory: Callable[[], Expression]) -> None:
    """Use `factory()` as the card's utilisation: a Subquery correlated to the annotated GpuPool."""
    global _utilisation
    _utilisation = factory


def utilisation_expression() -> Expression:
    return Value(None, output_field=FloatField()) if _utilisation is None else _utilisation()

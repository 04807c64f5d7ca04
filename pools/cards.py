"""The pool card's utilisation hook.

The card shows a pool's average SM activity. Until monitoring provides it, utilisation is null.
Monitoring replaces `utilisation_expression()` with an expression over `OuterRef("pk")` (the pool)
giving its average SM activity as a fraction 0..1 (e.g. a Subquery over its metric samples);
GpuPoolQuerySet.with_card() annotates it in the same query as the other card figures.
"""

from django.db.models import FloatField, Value


def utilisation_expression():
    """Average SM activity of the pool (0..1), or null when there are no metrics."""
    return Value(None, output_field=FloatField())

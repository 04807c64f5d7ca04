"""The pool card's utilisation: average SM activity of the pool's units over the last hour (0..1).

Read from monitoring's 5-minute rollups in the same query as the other card figures: pools sits below
monitoring and does not read its data, so the layers that show the card (the pools API, served from
monitoring.api, and the project dashboard) add it to GpuPool.objects.with_card() with with_utilisation().
A unit is a MIG instance series, or the GPU series for full GPUs and time-slice replicas. Null when
nothing was measured: never a zero that was not seen.
"""

from datetime import timedelta

from django.db.models import Avg, Exists, FloatField, OuterRef, Q, Subquery, Value
from django.utils import timezone

from pools.models import Allocation, GpuPoolQuerySet

from ..models import Rollup5m

WINDOW = timedelta(hours=1)


def utilisation_expression():
    """Unweighted mean of the pool's units' 5-minute SM activity over WINDOW, as a fraction."""
    pool = OuterRef(OuterRef("pk"))
    active = Allocation.objects.active()
    held_instance = active.filter(pool_id=pool, mig_instance_id=OuterRef("series__mig_instance_id"))
    held_gpu = active.filter(pool_id=pool, mig_instance__isnull=True, gpu_id=OuterRef("series__gpu_id"))
    rollups = (
        Rollup5m.objects.filter(bucket__gte=timezone.now() - WINDOW, sm_active_avg__isnull=False)
        .filter(
            (Q(series__mig_instance__isnull=False) & Exists(held_instance))
            | (Q(series__mig_instance__isnull=True) & Exists(held_gpu))
        )
        .order_by()
        .annotate(one=Value(1))
        .values("one")
        .annotate(avg=Avg("sm_active_avg"))
        .values("avg")
    )
    return Subquery(rollups, output_field=FloatField()) / Value(100.0)


def with_utilisation(pools: GpuPoolQuerySet) -> GpuPoolQuerySet:
    """`pools` annotated with the card's `utilisation` (GpuPool.card() reads it), in the same query."""
    return pools.annotate(utilisation=utilisation_expression())

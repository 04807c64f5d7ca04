"""The pool card's utilisation comes from monitoring's rollups of the pool's own units, or is null."""

from datetime import timedelta

import pytest
from django.utils import timezone

from monitoring.models import Rollup5m, Series
from monitoring.readers.cards import with_utilisation
from pools import services
from pools.models import GpuPool

pytestmark = pytest.mark.django_db

THREE_THREE = ["3g.40gb", "3g.40gb"]


def _rollup(series, sm, minutes_ago):
    bucket = (timezone.now() - timedelta(minutes=minutes_ago)).replace(second=0, microsecond=0)
    Rollup5m.objects.create(series=series, bucket=bucket, samples=10, sm_active_avg=sm)


def test_card_averages_the_pools_units_and_ignores_others(fleet, make_request, operator):
    node = fleet.mig_node("n1", [THREE_THREE, THREE_THREE])
    pool = services.approve(make_request(count=2), actor=operator)
    held = [a.mig_instance for a in pool.allocations.select_related("mig_instance")]
    assert with_utilisation(GpuPool.objects.with_card()).get(pk=pool.pk).utilisation is None  # nothing measured yet
    for instance, sm in zip(held, (30.0, 70.0), strict=True):
        _rollup(Series.objects.create(gpu=instance.gpu, mig_instance=instance), sm, 10)
    other = node.gpus.exclude(mig_instances__in=held).first().mig_instances.first()
    _rollup(Series.objects.create(gpu=other.gpu, mig_instance=other), 99.0, 10)  # not the pool's
    _rollup(Series.objects.get(mig_instance=held[0]), 90.0, 180)  # outside the last hour
    assert with_utilisation(GpuPool.objects.with_card()).get(pk=pool.pk).utilisation == pytest.approx(0.5)

"""A pool across clusters is billed as one pool: its units on every cluster summed into one set of lines."""

from decimal import Decimal

import pytest
from billing_helpers import at, month

from billing import services
from capacity.models import Cluster, GpuCapacity, NodeCapacity
from pools.models import PoolCluster

pytestmark = pytest.mark.django_db


def west_gpu(index: int = 0, product: str = "H100-80GB") -> GpuCapacity:
    """A GPU on a second cluster, "west" (the allocate fixture's own cluster is "billing")."""
    west, _ = Cluster.objects.get_or_create(name="west", defaults={"kubeconfig_path": "/dev/null"})
    node, _ = NodeCapacity.objects.get_or_create(cluster=west, name="west-1", defaults={"gpu_count": 8})
    return GpuCapacity.objects.create(
        node=node, index=index, uuid=f"GPU-west-{index}", product="NVIDIA GPU", catalog_product=product
    )


def span(pool, *gpus) -> None:
    """The PoolCluster rows approval writes for a pool on its home cluster and the clusters of `gpus`."""
    for cluster_id in {pool.cluster_id, *(g.node.cluster_id for g in gpus)}:
        PoolCluster.objects.get_or_create(pool=pool, cluster_id=cluster_id)


def test_units_on_two_clusters_make_one_line_with_the_hours_summed(project, allocate):
    first = allocate(project, "2026-03-10 10:00", "2026-03-10 12:00", kind="mig", profile="3g.40gb")
    pool = first.pool
    allocate(project, "2026-03-10 10:00", "2026-03-10 12:00", kind="mig", profile="3g.40gb", pool=pool)
    gpu = west_gpu()
    allocate(project, "2026-03-10 10:00", "2026-03-10 11:00", kind="mig", profile="3g.40gb", pool=pool, gpu=gpu)
    span(pool, gpu)

    services.meter_usage(now=at("2026-03-10 13:00"))
    statement = services.generate_statement(project, month("2026-03"))

    # 2 h + 2 h on "billing", 1 h on "west", at the 3g.40gb rate of 1.25/h: one line for the pool.
    lines = list(statement.lines.values_list("pool_id", "profile_name", "hours", "amount"))
    assert lines == [(pool.pk, "3g.40gb", Decimal("5.0000"), Decimal("6.25"))]
    assert (statement.reserved_hours, statement.total_amount) == (Decimal("5.0000"), Decimal("6.25"))


def test_different_products_on_two_clusters_break_down_by_spec_as_any_pool_does(project, allocate):
    first = allocate(project, "2026-03-10 10:00", "2026-03-10 11:00", kind="mig", profile="3g.40gb")
    pool = first.pool
    gpu = west_gpu(product="A100-80GB")
    allocate(
        project,
        "2026-03-10 10:00",
        "2026-03-10 11:00",
        kind="mig",
        product="A100-80GB",
        profile="3g.40gb",
        pool=pool,
        gpu=gpu,
    )
    span(pool, gpu)

    services.meter_usage(now=at("2026-03-10 12:00"))
    statement = services.generate_statement(project, month("2026-03"))

    lines = sorted(statement.lines.values_list("pool_id", "product", "hours"))
    assert lines == [(pool.pk, "A100-80GB", Decimal("1.0000")), (pool.pk, "H100-80GB", Decimal("1.0000"))]

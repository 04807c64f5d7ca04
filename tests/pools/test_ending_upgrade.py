"""Upgrading to pools.0018 (issue #25): units released before it are not "ending" (nobody evicts their pods
now), and lending becomes opt-in: every existing pool stops lending and its lent units start their grace
period (docs/queue.md, Borrowing; docs/pools.md, Ending)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
BEFORE = [("pools", "0017_borrower_bookkeeping")]
AFTER = [("pools", "0018_allocation_ending_and_lending_opt_in")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    return executor.migrate(targets).apps


def test_released_units_are_not_ending_and_lending_turns_off():
    old = migrate(BEFORE)
    project = old.get_model("tenancy", "Project").objects.create(name="A", slug="a", namespace="a")
    borrower = old.get_model("tenancy", "Project").objects.create(name="B", slug="b", namespace="b")
    cluster = old.get_model("capacity", "Cluster").objects.create(name="c", kubeconfig_path="/tmp/c")
    node = old.get_model("capacity", "NodeCapacity").objects.create(cluster=cluster, name="n", ready=True)
    gpus = [
        old.get_model("capacity", "GpuCapacity").objects.create(node=node, index=i, uuid=f"GPU-{i}") for i in range(2)
    ]
    request = old.get_model("pools", "PoolRequest").objects.create(project=project, state="active", count=2)
    pool = old.get_model("pools", "GpuPool").objects.create(
        project=project, request=request, cluster=cluster, name="p", workload_type="inference", state="active"
    )
    assert pool.lending_enabled is True  # the old default
    released_at = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    Allocation = old.get_model("pools", "Allocation")
    gone = Allocation.objects.create(
        pool=pool, project=project, kind="full", gpu=gpus[0], resource_name="nvidia.com/gpu", released_at=released_at
    )
    held = Allocation.objects.create(
        pool=pool, project=project, kind="full", gpu=gpus[1], resource_name="nvidia.com/gpu"
    )
    loan = old.get_model("pools", "Loan").objects.create(allocation=held, lender_pool=pool, borrower=borrower)

    new = migrate(AFTER)

    Allocation = new.get_model("pools", "Allocation")
    assert Allocation.objects.get(pk=gone.pk).vacated_at == released_at
    assert Allocation.objects.get(pk=held.pk).vacated_at is None
    assert new.get_model("pools", "GpuPool").objects.get(pk=pool.pk).lending_enabled is False
    loan = new.get_model("pools", "Loan").objects.get(pk=loan.pk)
    assert (loan.state, loan.reason) == ("reclaiming", "lending became opt-in (off by default)")
    assert loan.reclaim_requested_at is not None
    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

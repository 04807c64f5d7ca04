"""Benchmark clusters (#28): names no other run takes, and each run removes its own clusters and no younger one.

`bench discovery --nodes 200` failed on PostgreSQL with `Key (name)=(bench-discovery-<second>-200) already exists`
when two runs fell in the same second; and each run deleted every cluster with its prefix, another run's too.
"""

import io
from datetime import timedelta

import pytest
from django.utils import timezone

from benchmarks.capacity import (
    BENCH_PREFIX,
    STALE_AFTER,
    delete_bench_clusters,
    run_discovery_bench,
    stale_bench_clusters,
    unique_name,
)
from capacity.models import Cluster, GpuCapacity, NodeCapacity
from monitoring.models import Sample, Series
from monitoring.services.ingest import ingest_samples, sample_row

pytestmark = pytest.mark.django_db


def test_names_made_in_the_same_instant_for_the_same_size_differ():
    names = {unique_name(BENCH_PREFIX, "small", 200) for _ in range(50)}
    assert len(names) == 50
    assert all(n.startswith(BENCH_PREFIX) and n.endswith("-small-200") for n in names)


def _cluster(name: str, *, age: timedelta = timedelta()) -> Cluster:
    cluster = Cluster.objects.create(name=name, kubeconfig_path="/dev/null")
    Cluster.objects.filter(pk=cluster.pk).update(created_at=timezone.now() - age)
    node = NodeCapacity.objects.create(cluster=cluster, name="n1", gpu_count=1)
    gpu = GpuCapacity.objects.create(node=node, index=0, uuid=f"GPU-{name}", product="H100-80GB")
    series = Series.objects.create(gpu=gpu)
    ingest_samples([sample_row(series.pk, timezone.now(), {"power_w": 1.0})])
    return cluster


def test_only_clusters_older_than_a_run_can_last_are_stale():
    left = _cluster(unique_name(BENCH_PREFIX, 200), age=STALE_AFTER + timedelta(minutes=1))
    _cluster(unique_name(BENCH_PREFIX, 200))  # another run's, in progress
    _cluster("bench-poll-x-200", age=STALE_AFTER * 2)  # another benchmark's
    assert list(stale_bench_clusters(BENCH_PREFIX)) == [left]


def test_deleting_bench_clusters_takes_their_rows_and_samples_and_nothing_else():
    mine, other = _cluster(unique_name(BENCH_PREFIX, 2)), _cluster(unique_name(BENCH_PREFIX, 2))
    assert delete_bench_clusters(Cluster.objects.filter(pk=mine.pk)) == 1
    assert list(Cluster.objects.all()) == [other]
    assert Sample.objects.count() == 1 and GpuCapacity.objects.get().node.cluster == other


def test_a_discovery_run_removes_its_own_clusters_and_leaves_another_runs(settings):
    other = _cluster(unique_name(BENCH_PREFIX, "big", 20))  # a run started in the same second, same size
    result = run_discovery_bench(
        stdout=io.StringIO(), nodes=20, gpus_per_node=8, small_nodes=20, repeat=1, first_repeat=1
    )
    assert (result["nodes"], result["gpus"]) == (20, 160)
    assert list(Cluster.objects.all()) == [other]

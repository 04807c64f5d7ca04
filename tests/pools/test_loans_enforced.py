"""Loans are given back (issue #25, item 3; docs/queue.md, Borrowing): against the simulator (device plugin,
scenario "demo"), lending is opt-in per pool, a lender's Pending pod takes back only the units it needs, and
every non-owner pod on a returned device is evicted within the grace period, whatever its priority class."""

from __future__ import annotations

import datetime as dt

import pytest

from capacity.services.discovery import discover_cluster
from pools import lending, services
from pools.exceptions import LendingRefused
from pools.models import Allocation, Eviction, GpuPool, Loan
from pools.provisioning import BORROWED_PRIORITY_CLASS, BORROWING_LABEL
from pools.signals import loan_reclaimed
from pools.tasks import provision_pool_task, reconcile_project_task

pytestmark = pytest.mark.django_db
MIG = "nvidia.com/mig-3g.40gb"
NODE = "prod-h100-bal-01"


def create_pod(sim, namespace: str, name: str, *, priority: str = "", labels: dict | None = None) -> None:
    from simcluster.kube import ClusterApi

    spec = {
        "terminationGracePeriodSeconds": 0,
        "nodeSelector": {"kubernetes.io/hostname": NODE},
        "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {MIG: "1"}}}],
    }
    if priority:
        spec["priorityClassName"] = priority
    with sim.state.lock:
        ClusterApi(sim.state.cluster("prod")).create(
            "pods", namespace, {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}
        )


def pod(sim, namespace: str, name: str) -> dict | None:
    record = sim.state.cluster("prod").pods.get((namespace, name))
    return None if record is None else record.obj


@pytest.fixture
def lender(sim, make_request, operator):
    """team-a holds the 8 3g.40gb units of one node, provisioned, lending turned on by its admin."""
    pool = services.approve(make_request(count=8), actor=operator)
    assert provision_pool_task(pool.pk) == "active"
    assert lending.set_lending(pool, True) is True
    pool.refresh_from_db()
    return pool, list(Allocation.objects.active().filter(pool=pool).order_by("pk"))


def lend(pool, units, borrower, n: int) -> list[Loan]:
    loans = [lending.lend(unit, borrower) for unit in units[:n]]
    assert reconcile_project_task(borrower.pk, pool.cluster_id) is True
    return loans


def test_lending_is_off_until_the_pool_opts_in(sim, make_request, operator, other_project):
    pool = services.approve(make_request(count=2), actor=operator)
    assert pool.lending_enabled is False
    with pytest.raises(LendingRefused):
        lending.lend(Allocation.objects.active().filter(pool=pool).first(), other_project)
    assert not Loan.objects.exists()


@pytest.mark.postgres
def test_one_pending_lender_pod_takes_back_one_unit_not_all(sim, lender, other_project, settings):
    settings.LENDING_RECLAIM_GRACE_S = 120
    pool, units = lender
    cluster = sim.clusters["prod"]
    loans = lend(pool, units, other_project, 3)
    for i in range(3):
        create_pod(sim, "team-b", f"b{i}", priority=BORROWED_PRIORITY_CLASS)
    for i in range(6):  # 5 free units for the lender, then one Pending
        create_pod(sim, "team-a", f"a{i}")
    assert [pod(sim, "team-a", f"a{i}")["status"]["phase"] for i in range(6)].count("Pending") == 1
    t0 = dt.datetime(2026, 12, 6, 10, 0, tzinfo=dt.UTC)
    assert lending.reconcile_loans(cluster, now=t0)["reclaiming"] == 1
    assert sorted(Loan.objects.values_list("state", flat=True)) == ["active", "active", "reclaiming"]
    # The next pass sees the unit already coming back: nothing more is reclaimed for the same pod.
    assert lending.reconcile_loans(cluster, now=t0 + dt.timedelta(seconds=30))["reclaiming"] == 0
    result = lending.reconcile_loans(cluster, now=t0 + dt.timedelta(seconds=120))
    assert (result["ended"], result["evicted"]) == (1, 1)
    assert Loan.objects.filter(pk__in=[x.pk for x in loans], state="active").count() == 2
    assert sum(pod(sim, "team-b", f"b{i}") is not None for i in range(3)) == 2


@pytest.mark.postgres
def test_a_borrower_pod_without_the_borrowed_class_is_evicted_too(sim, lender, other_project, settings):
    settings.LENDING_RECLAIM_GRACE_S = 60
    pool, units = lender
    cluster = sim.clusters["prod"]
    lend(pool, units, other_project, 1)
    for i in range(7):
        create_pod(sim, "team-a", f"a{i}")
    create_pod(sim, "team-b", "sneaky")  # no PriorityClass: on the lent device all the same
    assert pod(sim, "team-b", "sneaky")["status"]["phase"] == "Running"
    assert discover_cluster(cluster.pk, inventory="none").run.status == "succeeded"  # the mirror knows its device
    create_pod(sim, "team-a", "a7")
    assert pod(sim, "team-a", "a7")["status"]["phase"] == "Pending"
    t0 = dt.datetime(2026, 12, 6, 10, 0, tzinfo=dt.UTC)
    received = []
    loan_reclaimed.connect(lambda sender, **kw: received.append(kw), weak=False, dispatch_uid="test-reclaim")
    try:
        assert lending.reconcile_loans(cluster, now=t0)["reclaiming"] == 1
    finally:
        loan_reclaimed.disconnect(dispatch_uid="test-reclaim")
    assert lending.reconcile_loans(cluster, now=t0 + dt.timedelta(seconds=60))["evicted"] == 1
    assert pod(sim, "team-b", "sneaky") is None
    assert pod(sim, "team-a", "a7")["status"]["phase"] == "Running"
    row = Eviction.objects.get()
    assert (row.pod_name, row.outcome, row.project_id, row.loan.state) == (
        "sneaky",
        "evicted",
        other_project.pk,
        "ended",
    )


@pytest.mark.postgres
def test_a_disruption_budget_does_not_keep_a_lent_unit_past_the_grace_period(sim, lender, other_project, settings):
    from simcluster.kube import ClusterApi

    settings.LENDING_RECLAIM_GRACE_S = 60
    pool, units = lender
    cluster = sim.clusters["prod"]
    lend(pool, units, other_project, 1)
    create_pod(sim, "team-b", "kept", priority=BORROWED_PRIORITY_CLASS, labels={"app": "k"})
    with sim.state.lock:
        ClusterApi(sim.state.cluster("prod")).create(
            "poddisruptionbudgets",
            "team-b",
            {"metadata": {"name": "k"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "k"}}}},
        )
    t0 = dt.datetime(2026, 12, 6, 10, 0, tzinfo=dt.UTC)
    assert lending.reclaim_pool(pool, at=t0) == 1
    assert lending.reconcile_loans(cluster, now=t0 + dt.timedelta(seconds=60))["ended"] == 1
    assert pod(sim, "team-b", "kept") is None
    assert Eviction.objects.get().outcome == "forced"


@pytest.mark.postgres
def test_a_borrower_on_lent_units_only_is_labelled_for_the_admission_policy(sim, lender, other_project):
    from capacity.adapters.kubernetes import KubernetesClient

    pool, units = lender
    (loan,) = lend(pool, units, other_project, 1)
    with KubernetesClient.for_cluster(sim.clusters["prod"]) as kube:
        labels = kube.get_namespace("team-b")["metadata"]["labels"]
    assert labels[BORROWING_LABEL] == "only"
    lending.end_loan(loan, reason="done")
    assert reconcile_project_task(other_project.pk, pool.cluster_id) is True
    with KubernetesClient.for_cluster(sim.clusters["prod"]) as kube:
        assert BORROWING_LABEL not in kube.get_namespace("team-b")["metadata"]["labels"]
    assert GpuPool.objects.get(pk=pool.pk).lending_enabled is True

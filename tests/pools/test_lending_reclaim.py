"""Taking lent units back (pools/lending.py, reconcile_loans and end_loan) on SQLite, in a world unlike a toy
one: a spare cluster first (cluster, node, GPU and MIG ids differ from pool, allocation and loan ids), clusters a
and b, whole and MIG GPUs, the borrower's own units beside the lent ones, and a third project's pods.

The cluster is a recording double of the Kubernetes calls reconcile_loans() makes (pods listed, pods evicted);
the workload mirror (capacity's WorkloadProfile) is written as discovery records it. What is checked is what
lending decides from them:

- every pod the mirror places on a returned device is evicted unless it is the lender's, whatever its project
  (a third project's pod too), and nothing on another device is (the borrower's pod on its own unit, whole or
  MIG, stays);
- placed by count (the mirror knows nothing), the borrower's pods of the borrowed PriorityClass go first, then
  the others by name; finished pods and pods of another resource are not counted;
- a lender's Pending pods take back as many loans as they wait for, less the loans already coming back; a loan
  still lent is not ended; loans of another cluster are left alone;
- end_loan() ends a loan once.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from unittest import mock

import pytest

from capacity.adapters.kubernetes import NotFound
from capacity.adapters.kubernetes.objects import Pod
from capacity.models import NodeCapacity, WorkloadProfile
from pools import lending, services
from pools.choices import LoanState
from pools.models import Allocation, Eviction, GpuPool, Loan
from pools.provisioning import BORROWED_PRIORITY_CLASS
from tenancy.models import Project

pytestmark = pytest.mark.django_db
FULL = dict(isolation="full", product="H100-80GB", profile_name="")
GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-3g.40gb"
T0 = dt.datetime(2026, 12, 7, 10, 0, tzinfo=dt.UTC)
GRACE = dt.timedelta(seconds=120)


def pod(
    namespace: str, name: str, node: str, *, resource: str = GPU, phase: str = "Running", priority: str = ""
) -> Pod:
    return Pod(
        namespace=namespace,
        name=name,
        uid=f"uid-{namespace}-{name}",
        node_name=node,
        phase=phase,
        labels={},
        annotations={},
        requests={resource: 1},
        start_time=None,
        deleted=False,
        priority_class=priority,
    )


@dataclass
class Kube:
    """The pods of one cluster as the Kubernetes API lists them, and the evictions asked of it (in order). A
    namespace in `missing` does not exist: listing its pods is a 404."""

    pods: dict[tuple[str, str], Pod] = field(default_factory=dict)
    missing: set[str] = field(default_factory=set)
    evicted: list[tuple[str, str]] = field(default_factory=list)
    opened: list[str] = field(default_factory=list)

    def add(self, *pods: Pod) -> None:
        self.pods.update({(p.namespace, p.name): p for p in pods})

    def __call__(self, cluster):
        self.opened.append(cluster.name)
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def list_pods(self, namespace: str = "", *, label_selector: str = "", field_selector: str = "") -> list[Pod]:
        assert field_selector == "status.phase=Pending"
        if namespace in self.missing:
            raise NotFound(f"namespace {namespace}", status=404)
        return [p for p in self.pods.values() if p.namespace == namespace and p.phase == "Pending"]

    def list_pods_on_node(self, node_name: str, namespace: str = "", *, label_selector: str = "") -> list[Pod]:
        if namespace in self.missing:
            raise NotFound(f"namespace {namespace}", status=404)
        return [p for p in self.pods.values() if p.node_name == node_name and p.namespace == namespace]

    def evict_pod(self, namespace: str, name: str, *, grace_period_s: int | None = None) -> None:
        if self.pods.pop((namespace, name), None) is None:
            raise NotFound(f"pod {namespace}/{name}", status=404)
        self.evicted.append((namespace, name))


@pytest.fixture
def team_c(db):
    return Project.objects.create(name="Team C", slug="team-c", namespace="team-c")


@pytest.fixture
def world(fleet, project, other_project, team_c, make_request, operator):
    """Spare cluster (team-c holds two of its GPUs, then it is cordoned); on cluster a: `a-full` (4 whole GPUs:
    team-b holds GPU 0, team-a GPUs 1-3) and `a-mig` (one GPU, two 3g.40gb: team-b holds the first, team-a the
    second); on cluster b: `b-full` (team-a holds its GPU). team-a's pools lend."""
    spare = fleet.full_node("spare-1", gpus=3, cluster="spare")
    services.approve(make_request(count=2, target=team_c, actor=operator, **FULL), actor=operator)
    NodeCapacity.objects.filter(pk=spare.pk).update(cordoned=True)
    fleet.full_node("a-full", gpus=4, cluster="a")
    services.approve(make_request(count=1, target=other_project, actor=operator, **FULL), actor=operator)
    services.approve(make_request(count=3, **FULL), actor=operator)
    fleet.mig_node("a-mig", [["3g.40gb", "3g.40gb"]], cluster="a")
    services.approve(make_request(count=1, target=other_project, actor=operator), actor=operator)
    services.approve(make_request(count=1), actor=operator)
    fleet.full_node("b-full", gpus=1, cluster="b")
    services.approve(make_request(count=1, **FULL), actor=operator)
    GpuPool.objects.filter(project=project).update(lending_enabled=True)
    return fleet


def unit(project, node: str, *, index: int = 0, start: int | None = None) -> Allocation:
    units = Allocation.objects.active().filter(pool__project=project, gpu__node__name=node, gpu__index=index)
    return units.get() if start is None else units.get(mig_instance__placement_start=start)


def on_mirror(project, name: str, held: Allocation, **fields) -> WorkloadProfile:
    """The mirror's row for `project`'s pod `name` on the device of `held` (as discovery records it)."""
    node = held.gpu.node
    return WorkloadProfile.objects.create(
        cluster=node.cluster,
        namespace=project.namespace,
        pod_name=name,
        pod_uid=f"uid-{project.namespace}-{name}",
        node=node,
        gpu=held.gpu,
        mig_instance=held.mig_instance,
        resource_name=held.resource_name,
        project=project,
        **fields,
    )


def test_the_world_ids_differ_and_units_are_where_the_tests_say(world, project, other_project):
    lent = unit(project, "a-full", index=1)
    own = unit(other_project, "a-full", index=0)
    assert (lent.resource_name, own.resource_name, lent.mig_instance_id) == (GPU, GPU, None)
    lent_mig, own_mig = unit(project, "a-mig", start=4), unit(other_project, "a-mig", start=0)
    assert own_mig.mig_instance_id < lent_mig.mig_instance_id and lent_mig.resource_name == MIG
    assert lent.pk != lent.gpu_id and lent.pool_id != lent.pool.project_id != other_project.pk


def reclaimed(lender: Allocation, borrower, *, at: dt.datetime = T0) -> Loan:
    """`lender` lent to `borrower`, and the lender asked for it back at `at`."""
    loan = lending.lend(lender, borrower, at=at - dt.timedelta(hours=1))
    assert lending.request_reclaim(loan, reason="the lender asked", at=at) is True
    return loan


def reconcile(cluster, kube: Kube, now: dt.datetime) -> dict:
    """reconcile_loans() with `kube` as the cluster; the borrowers' grants it reconciles are recorded, not applied."""
    with mock.patch("pools.lending.reconcile") as grants:
        result = lending.reconcile_loans(cluster, now=now, client_factory=kube)
    result["grants"] = sorted(call.args[0].namespace for call in grants.call_args_list)
    return result


@pytest.fixture
def settings_grace(settings):
    settings.LENDING_RECLAIM_GRACE_S = int(GRACE.total_seconds())


def test_every_non_lender_pod_the_mirror_places_on_a_returned_gpu_is_evicted_and_nothing_else(
    world, project, other_project, team_c, settings_grace
):
    lent, own = unit(project, "a-full", index=1), unit(other_project, "a-full", index=0)
    loan = reclaimed(lent, other_project)
    kube = Kube()
    kube.add(
        pod("team-b", "b-lent", "a-full", priority=BORROWED_PRIORITY_CLASS),
        pod("team-b", "b-home", "a-full"),
        pod("team-c", "c-squat", "a-full"),
        pod("team-a", "a-own", "a-full"),
    )
    on_mirror(other_project, "b-lent", lent)
    on_mirror(other_project, "b-home", own)  # the borrower's own GPU: not lent, not touched
    on_mirror(team_c, "c-squat", lent)  # a third project on the lent GPU: not the lender's, so it goes
    on_mirror(project, "a-own", lent)  # the lender's own pod on its own unit stays
    on_mirror(team_c, "c-gone", lent, ended_at=T0)  # a pod the mirror saw end is not evicted again
    assert reconcile(world.clusters["a"], kube, T0 + GRACE - dt.timedelta(seconds=1))["ended"] == 0
    assert kube.evicted == []  # within the grace period nothing is touched
    result = reconcile(world.clusters["a"], kube, T0 + GRACE)
    assert (result["ended"], result["evicted"], result["grants"]) == (1, 2, ["team-b"])
    assert kube.evicted == [("team-b", "b-lent"), ("team-c", "c-squat")]
    loan.refresh_from_db()
    assert (loan.state, loan.returned_at, loan.evicted_pods) == (LoanState.ENDED, T0 + GRACE, ["b-lent"])
    audited = Eviction.objects.order_by("pk").values_list("pod_name", "project_id", "loan_id", "outcome")
    assert list(audited) == [
        ("b-lent", other_project.pk, loan.pk, "evicted"),
        ("c-squat", team_c.pk, loan.pk, "evicted"),
    ]


def test_a_returned_mig_instance_takes_only_its_own_pods_not_the_borrowers_on_the_next_instance(
    world, project, other_project, settings_grace
):
    lent, own = unit(project, "a-mig", start=4), unit(other_project, "a-mig", start=0)
    loan = reclaimed(lent, other_project)
    kube = Kube()
    kube.add(
        pod("team-b", "b-home", "a-mig", resource=MIG),  # on its own instance, the lower id
        pod("team-b", "b-lent", "a-mig", resource=MIG),
    )
    on_mirror(other_project, "b-home", own)
    on_mirror(other_project, "b-lent", lent)
    assert reconcile(world.clusters["a"], kube, T0 + GRACE)["evicted"] == 1
    assert kube.evicted == [("team-b", "b-lent")]
    loan.refresh_from_db()
    assert loan.evicted_pods == ["b-lent"]


def test_by_count_the_borrowed_class_goes_first_and_pods_not_holding_the_resource_are_not_counted(
    world, project, other_project, settings_grace
):
    """The mirror knows none of these pods (device plugin, no PodResources): team-b holds its own GPU and two lent
    ones on a-full, one of which comes back, so one of its GPU pods there must go."""
    back = reclaimed(unit(project, "a-full", index=1), other_project)
    lending.lend(unit(project, "a-full", index=2), other_project, at=T0)  # stays lent
    kube = Kube()
    kube.add(
        pod("team-b", "0-cpu", "a-full", resource="cpu"),  # holds no GPU: never counted
        pod("team-b", "0-done", "a-full", phase="Succeeded", priority=BORROWED_PRIORITY_CLASS),  # finished
        pod("team-b", "a-high", "a-full", priority="high-priority"),
        pod("team-b", "b-borrowed", "a-full", priority=BORROWED_PRIORITY_CLASS),
        pod("team-b", "c-plain", "a-full"),
        pod("team-b", "d-elsewhere", "a-mig", resource=MIG),  # another node
    )
    assert reconcile(world.clusters["a"], kube, T0 + GRACE)["evicted"] == 1
    assert kube.evicted == [("team-b", "b-borrowed")]
    back.refresh_from_db()
    assert (back.state, back.evicted_pods) == (LoanState.ENDED, ["b-borrowed"])


def test_pending_lender_pods_take_back_what_they_wait_for_less_what_is_already_coming_back(
    world, project, other_project, settings_grace
):
    """team-a lends its three GPUs of a-full and asks one back by hand; then two of its pods are Pending for a GPU:
    one more loan is reclaimed, not two, and not the one already coming back. Its loan on cluster b, reclaimed
    long ago, is not this cluster's to end."""
    first, second, third = (
        lending.lend(unit(project, "a-full", index=i), other_project, at=T0 - dt.timedelta(hours=1)) for i in (1, 2, 3)
    )
    elsewhere = reclaimed(unit(project, "b-full"), other_project, at=T0 - dt.timedelta(hours=1))
    assert lending.request_reclaim(first, reason="the lender asked", at=T0) is True
    kube = Kube()
    kube.add(
        pod("team-a", "wants-1", "", phase="Pending"),
        pod("team-a", "wants-2", "", phase="Pending"),
        pod("team-a", "wants-mig", "", phase="Pending", resource=MIG),  # no MIG unit of team-a's is lent here
        pod("team-b", "not-the-lender", "", phase="Pending"),
    )
    result = reconcile(world.clusters["a"], kube, T0 + dt.timedelta(seconds=10))
    assert (result["reclaiming"], result["ended"], result["grants"]) == (1, 0, ["team-b"])
    states = dict(Loan.objects.values_list("pk", "state"))
    assert [states[x.pk] for x in (first, second, third, elsewhere)] == [
        "reclaiming",
        "reclaiming",
        "active",
        "reclaiming",
    ]
    assert Loan.objects.get(pk=second.pk).reclaim_requested_at == T0 + dt.timedelta(seconds=10)
    # Each reclaim ends after its own grace period; the pods still Pending are covered by the two coming back.
    result = reconcile(world.clusters["a"], kube, T0 + GRACE)
    assert (result["reclaiming"], result["ended"]) == (0, 1)
    states = dict(Loan.objects.values_list("pk", "state"))
    assert [states[x.pk] for x in (first, second, third, elsewhere)] == ["ended", "reclaiming", "active", "reclaiming"]
    assert kube.opened == ["a", "a"]


def test_a_reclaim_reason_is_cut_to_the_column_in_the_row_the_loan_and_the_signal(
    world, project, other_project, settings_grace
):
    from pools.signals import loan_reclaimed

    loan = lending.lend(unit(project, "a-full", index=1), other_project, at=T0)
    reason = "the lender needs it back: " + "a long explanation " * 20
    received = []
    loan_reclaimed.connect(lambda sender, **kw: received.append(kw), weak=False, dispatch_uid="test-reclaim-reason")
    try:
        assert lending.request_reclaim(loan, reason=reason, at=T0) is True
    finally:
        loan_reclaimed.disconnect(dispatch_uid="test-reclaim-reason")
    assert len(reason) > 200
    assert loan.reason == Loan.objects.get(pk=loan.pk).reason == received[0]["reason"] == reason[:200]
    assert (received[0]["loan_id"], received[0]["evict_after"]) == (loan.pk, T0 + GRACE)


def test_end_loan_ends_a_loan_once(world, project, other_project):
    loan = lending.lend(unit(project, "a-full", index=1), other_project, at=T0)
    assert lending.end_loan(loan, reason="done", at=T0 + dt.timedelta(hours=1)) is True
    assert lending.end_loan(loan, reason="again", at=T0 + dt.timedelta(hours=2)) is False
    loan.refresh_from_db()
    assert (loan.state, loan.reason, loan.returned_at) == (LoanState.ENDED, "done", T0 + dt.timedelta(hours=1))


def test_a_released_unit_or_pool_is_not_lent(world, project, other_project):
    from pools.exceptions import LendingRefused

    released = unit(project, "a-full", index=1)
    Allocation.objects.filter(pk=released.pk).update(released_at=T0)  # the unit alone (its pool holds on)
    with pytest.raises(LendingRefused, match="released"):
        lending.lend(Allocation.objects.get(pk=released.pk), other_project)
    on_b = unit(project, "b-full")
    GpuPool.objects.filter(pk=on_b.pool_id).update(released_at=T0)  # the pool, its unit not yet
    with pytest.raises(LendingRefused, match="released"):
        lending.lend(Allocation.objects.get(pk=on_b.pk), other_project)
    assert not Loan.objects.exists()
    assert lending.lend(unit(project, "a-full", index=2), other_project).state == LoanState.ACTIVE


def test_a_loan_of_a_released_unit_ends_at_once_even_where_the_namespaces_are_gone(
    world, project, other_project, team_c, settings_grace
):
    """The lender's unit is released (its pool holds on): no grace period. team-a's and team-b's namespaces are
    gone from the cluster: listing them is a 404, and the third project's pod the mirror places on the unit goes."""
    lent = unit(project, "a-full", index=1)
    loan = lending.lend(lent, other_project, at=T0 - dt.timedelta(hours=1))
    kept = lending.lend(unit(project, "a-full", index=2), other_project, at=T0 - dt.timedelta(hours=1))
    Allocation.objects.filter(pk=lent.pk).update(released_at=T0)
    kube = Kube(missing={"team-a", "team-b"})
    kube.add(pod("team-c", "c-squat", "a-full"))
    on_mirror(team_c, "c-squat", lent)
    result = reconcile(world.clusters["a"], kube, T0)
    assert (result["reclaiming"], result["ended"], result["evicted"], result["grants"]) == (0, 1, 1, ["team-b"])
    assert kube.evicted == [("team-c", "c-squat")]
    loan.refresh_from_db()
    assert (loan.state, loan.returned_at, loan.reason, loan.evicted_pods) == (
        LoanState.ENDED,
        T0,
        "the lender's unit was released",
        [],
    )
    assert Loan.objects.get(pk=kept.pk).state == LoanState.ACTIVE


def test_ending_a_best_effort_request_cuts_its_reason_to_the_column(world, project, other_project):
    from pools.models import BestEffortRequest

    asked = BestEffortRequest.objects.create(project=other_project, product="H100-80GB", profile_name="")
    loan = lending.lend(unit(project, "a-full", index=1), other_project, best_effort=asked, at=T0)
    reason = "the member is done with it: " + "a long explanation " * 20
    assert lending.end_best_effort(asked, reason=reason, at=T0 + dt.timedelta(hours=1)) is True
    assert lending.end_best_effort(asked, reason="again", at=T0 + dt.timedelta(hours=2)) is False
    stored = BestEffortRequest.objects.get(pk=asked.pk)
    assert len(reason) > 200
    assert (stored.state, stored.ended_at, stored.end_reason) == ("ended", T0 + dt.timedelta(hours=1), reason[:200])
    assert (asked.state, asked.end_reason) == ("ended", reason[:200])
    loan.refresh_from_db()
    assert (loan.state, loan.returned_at, loan.reason) == (LoanState.ENDED, T0 + dt.timedelta(hours=1), reason[:200])

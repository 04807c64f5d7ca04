"""Which idle unit goes to which waiting request (monitoring/services/lending.py, lend_idle and _matches): a unit is
lent only to a request of another project whose kind, product, MIG profile and (when it names one) cluster it has.

The world is unlike the usual one: two clusters, the lender (team-b) created after the borrower (team-a) so the
lender's project id is the larger, and idle units of every near miss (a smaller and a larger MIG profile, a
slower and a faster product, the right spec on the wrong cluster, each side of each cluster id) flagged before the
units that do match. ORM fleet only: no simulator.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone
from test_borrowers import flag_idle

from capacity.choices import Tier
from capacity.models import Cluster
from monitoring.services.lending import lend_idle
from pools import lending, services
from pools.choices import RequestState
from pools.models import Allocation, GpuPool, Loan
from scheduling import queue
from scheduling.policy import queue_policy

pytestmark = pytest.mark.django_db
H = dt.timedelta(hours=1)
H100 = "H100-80GB"


@pytest.fixture
def world(fleet, make_request, operator, project, other_project, charlie):
    """east and west (ids past 256, as a long-lived fleet's are: an identity test would not pass for equality);
    team-b (the lender, the larger project id) holds one unit of each spec below, each its own lending pool, flagged
    idle in this order (the near misses first)."""
    for pk, name in ((301, "east"), (302, "west")):
        fleet.clusters[name] = Cluster.objects.create(pk=pk, name=name, kubeconfig_path=f"/tmp/{name}.kubeconfig")
    fleet.mig_node("east-mig", [["3g.40gb", "3g.40gb"], ["1g.10gb"], ["7g.80gb"]], cluster="east", tier=Tier.NONE)
    fleet.full_node("east-h100", gpus=1, cluster="east")
    fleet.full_node("east-a100", gpus=1, cluster="east", product="A100-80GB")
    fleet.full_node("east-h200", gpus=1, cluster="east", product="H200-141GB")
    fleet.mig_node("west-mig", [["3g.40gb"]], cluster="west")
    fleet.full_node("west-h100", gpus=1, cluster="west")
    east, west = fleet.clusters["east"], fleet.clusters["west"]
    assert other_project.pk > project.pk and east.pk < west.pk
    held = {}
    for name, spec, cluster in (
        ("mig-1g", {"isolation": "mig", "profile_name": "1g.10gb"}, east),
        ("mig-7g", {"isolation": "mig", "profile_name": "7g.80gb"}, east),
        ("mig-3g-east", {"isolation": "mig", "profile_name": "3g.40gb"}, east),
        ("a100", {"isolation": "full", "product": "A100-80GB", "profile_name": ""}, east),
        ("h200", {"isolation": "full", "product": "H200-141GB", "profile_name": ""}, east),
        ("full-west", {"isolation": "full", "profile_name": ""}, west),
        ("mig-3g-west", {"isolation": "mig", "profile_name": "3g.40gb"}, west),
        ("full-east", {"isolation": "full", "profile_name": ""}, east),
        ("mig-3g-east-2", {"isolation": "mig", "profile_name": "3g.40gb"}, east),
    ):
        request = make_request(count=1, target=other_project, actor=charlie, cluster=cluster, **spec)
        pool = services.approve(request, actor=operator)
        GpuPool.objects.filter(pk=pool.pk).update(lending_enabled=True)
        (held[name],) = Allocation.objects.active().filter(pool=pool)
    assert held["mig-3g-west"].gpu.node.cluster == west and held["full-east"].gpu.node.cluster == east
    now = timezone.now()
    for i, unit in enumerate(held.values()):
        flag_idle(unit, now - 24 * H + i * dt.timedelta(minutes=1))
    return held, east, west, now


def wait(make_request, count: int = 1, **fields):
    request = make_request(count=count, wait_if_full=True, **fields)
    queue.enqueue(request)
    assert request.state == RequestState.QUEUED
    return request


def lent() -> set[tuple[int, int]]:
    return set(Loan.objects.open().values_list("allocation_id", "borrower_request_id"))


def test_each_waiting_request_gets_only_the_idle_unit_of_its_spec_and_cluster(world, make_request, project):
    held, east, west, now = world
    mig = wait(make_request, isolation="mig", product=H100, profile_name="3g.40gb", cluster=west)
    full = wait(make_request, isolation="full", product=H100, profile_name="", cluster=east)
    shared = wait(make_request, isolation="timeslice", product=H100, profile_name="")
    made = lend_idle(now=now)
    assert lent() == {(held["mig-3g-west"].pk, mig.pk), (held["full-east"].pk, full.pk)}
    assert sorted(made) == sorted(Loan.objects.values_list("pk", flat=True))
    assert set(Loan.objects.values_list("borrower_id", flat=True)) == {project.pk}
    assert not Loan.objects.filter(borrower_request=shared).exists()  # no idle time-slice unit anywhere
    assert lend_idle(now=now + H) == []


def test_a_request_naming_no_cluster_takes_the_first_idle_unit_of_its_spec_on_either(world, make_request):
    held, east, west, now = world
    mig = wait(make_request, isolation="mig", product=H100, profile_name="3g.40gb")
    full = wait(make_request, isolation="full", product=H100, profile_name="")
    lend_idle(now=now)
    assert lent() == {(held["mig-3g-east"].pk, mig.pk), (held["full-west"].pk, full.pk)}


def test_a_request_gets_idle_units_up_to_its_count_and_the_next_waiting_request_the_rest(world, make_request):
    held, east, west, now = world
    two = wait(make_request, isolation="mig", product=H100, profile_name="3g.40gb", count=2)
    one = wait(make_request, isolation="mig", product=H100, profile_name="3g.40gb")
    assert len(lend_idle(now=now)) == 3
    assert lent() == {
        (held["mig-3g-east"].pk, two.pk),
        (held["mig-3g-west"].pk, two.pk),
        (held["mig-3g-east-2"].pk, one.pk),
    }


def test_a_request_already_holding_its_count_or_more_gets_nothing_more(world, make_request, project):
    held, east, west, now = world
    one = wait(make_request, isolation="mig", product=H100, profile_name="3g.40gb")
    for name in ("mig-3g-east", "mig-3g-west"):  # lent by hand, beyond its count
        lending.lend(held[name], project, request=one, at=now)
    assert lend_idle(now=now) == []
    assert lent() == {(held["mig-3g-east"].pk, one.pk), (held["mig-3g-west"].pk, one.pk)}


def test_a_unit_lent_by_a_concurrent_pass_is_skipped_and_the_next_idle_unit_serves(
    world, make_request, project, monkeypatch
):
    """Between this pass reading the idle units and lending them, another pass lends the first one (here while
    this one reads the queue): its lend is refused and the request gets the next unit of its spec."""
    held, east, west, now = world
    one = wait(make_request, isolation="mig", product=H100, profile_name="3g.40gb")
    ordered = queue_policy.ordered
    concurrent = []

    def ordered_while_another_pass_lends(**kwargs):
        concurrent.append(lending.lend(held["mig-3g-east"], project, at=now))
        return ordered(**kwargs)

    monkeypatch.setattr(queue_policy, "ordered", ordered_while_another_pass_lends)
    (made,) = lend_idle(now=now)
    assert made != concurrent[0].pk
    assert lent() == {(held["mig-3g-east"].pk, None), (held["mig-3g-west"].pk, one.pk)}

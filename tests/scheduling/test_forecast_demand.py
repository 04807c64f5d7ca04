"""Who takes the units first (scheduling/forecast/demand.py): the queue ahead of a request and the moves age makes in
it, read from a queue of three projects, several classes and specs on two clusters; the arrivals seen over the
window, their rate and which of them rank ahead; the arrival processes a draw reads."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random

import pytest
from django.utils import timezone

from capacity.models import Allocation
from pools import services
from pools.models import AutoApprovalPolicy, PoolRequest, QueueEntry
from scheduling.forecast import Arrival, Arrivals, KnownArrivals, Waiting, arrivals, queue_ahead
from tenancy.models import Project

FULL = {"isolation": "full", "product": "H100-80GB", "profile_name": ""}
MIG = {"isolation": "mig", "product": "H100-80GB", "profile_name": "3g.40gb"}
H = dt.timedelta(hours=1)


class Known:
    """A stand-in for random.Random whose draws are known: an exponential draw is its mean, a choice the last."""

    def expovariate(self, lambd: float) -> float:
        return 1 / lambd

    def choice(self, seq):
        return seq[-1]


def _arrival(count=1, ahead=False) -> Arrival:
    return Arrival(count, 1, "training", ahead=ahead, auto=False)


def test_arrivals_come_as_a_poisson_process_at_their_rate_each_like_a_sample():
    t = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
    samples = (_arrival(1, ahead=True), _arrival(2), _arrival(4), _arrival(8, ahead=True))
    coming = Arrivals(2.0, samples)
    assert coming.next_after(t, Known()) == t + H / 2  # the mean gap at 2 an hour
    assert coming.pick(Known()) == samples[-1]
    assert coming.ahead_per_h == 1.0  # half the samples rank ahead: 1 an hour of the 2
    assert Arrivals(3.0, samples[:3]).ahead_per_h == 1.0
    assert Arrivals(0.0, ()).next_after(t, Known()) is None
    assert Arrivals(2.0, ()).ahead_per_h == 0.0


def test_an_arrivals_process_is_a_value_no_draw_can_change():
    """Every draw of a forecast reads the one Arrivals: none may change it for the next."""
    coming = Arrivals(2.0, (_arrival(),))
    with pytest.raises(dataclasses.FrozenInstanceError):
        coming.rate_h = 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        coming.samples[0].count = 3
    assert hash(coming) == hash(Arrivals(2.0, (_arrival(),)))


def test_known_arrivals_come_at_their_times_each_as_its_own_sample():
    t = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
    times = [t + H, t + 2 * H, t + 5 * H]
    samples = [_arrival(1), _arrival(2), _arrival(3)]
    known = KnownArrivals(times, samples)
    rng = random.Random(1)
    assert (known.next_after(t, rng), known.pick(rng)) == (t + H, samples[0])
    assert (known.next_after(t + H, rng), known.pick(rng)) == (t + 2 * H, samples[1])  # strictly after
    assert (known.next_after(t + 3 * H, rng), known.pick(rng)) == (t + 5 * H, samples[2])
    assert known.next_after(t + 5 * H, rng) is None


@pytest.fixture
def now():
    return timezone.now().replace(microsecond=0)


@pytest.fixture
def team_c(db):
    return Project.objects.create(name="Team C", slug="team-c", namespace="team-c")


@pytest.fixture
def world(fleet, make_request, operator, project, team_c, now):
    """Two clusters of whole GPUs (east made first) and a MIG node in west. Team-a held a GPU of east for the
    last 20 hours and team-c one for the last 5: fair shares team-b (0) < team-c < team-a."""
    fleet.full_node("east-1", gpus=2, cluster="east")
    fleet.full_node("west-1", gpus=2, cluster="west")
    fleet.mig_node("west-mig", [["3g.40gb", "3g.40gb"]], cluster="west")
    for target, held_h in ((project, 20), (team_c, 5)):
        request = make_request(count=1, target=target, actor=operator, cluster=fleet.cluster("east"), **FULL)
        services.approve(request, actor=operator)
        Allocation.objects.filter(pool__request=request).update(allocated_at=now - held_h * H)
    return fleet


@pytest.fixture
def queued(make_request, operator, now):
    """queued(target, workload, waited_h, spec=FULL, **entry_fields): a request waiting in the queue."""

    def make(target, workload, waited_h, spec=FULL, count=1, cluster=None, **entry):
        pinned = {"cluster": cluster} if cluster is not None else {}
        request = make_request(count=count, target=target, actor=operator, workload_type=workload, **spec, **pinned)
        services.transition(request, "queued", None, "queued")
        QueueEntry.objects.create(request=request, queued_at=now - waited_h * H, **entry)
        return request

    return make


def _waiting(request, *, joins_at=None, leaves_at=None) -> Waiting:
    r = request
    return Waiting(r.count, r.project_id, r.workload_type, r.end_at, r.pk, joins_at=joins_at, leaves_at=leaves_at)


def test_the_queue_ahead_and_the_moves_age_makes_in_it(
    world, queued, project, other_project, team_c, now, settings, make_request, operator
):
    """A staging request of team-c, waiting 3 h, aged at 4 h (1 h from now). Ahead: a request an operator moved,
    a production one, a staging one aged already, and team-b's (lower share) staging ones: the one queued at the
    same instant but before it and the older stay ahead, the younger falls behind when team-c's is aged. Behind:
    team-c's younger one, and team-a's (higher share) older one, which comes ahead when it is aged (in 0.5 h).
    Team-a's older development request never comes ahead; on hold, of another spec or cluster: not in its queue."""
    settings.QUEUE_AGED_AFTER_H = 4
    same_instant = queued(other_project, "staging", 3)  # the same queued_at as mine, queued first
    aged = queued(other_project, "staging", 5)
    mine = queued(team_c, "staging", 3)
    moved = queued(project, "development", 0.25, manual_rank=1)
    production = queued(project, "inference", 0.5, count=2)
    younger = queued(other_project, "staging", 1)
    behind = queued(team_c, "staging", 2)
    older = queued(project, "staging", 3.5)
    queued(project, "development", 3.5)
    queued(other_project, "staging", 2.5, on_hold=True)
    queued(other_project, "staging", 2.5, cluster=world.cluster("west"))
    slices = queued(other_project, "staging", 2.5, spec=MIG)
    assert QueueEntry.objects.get(request=same_instant).queued_at == QueueEntry.objects.get(request=mine).queued_at

    assert queue_ahead(mine, now=now) == [
        _waiting(moved),
        _waiting(production),
        _waiting(aged),
        _waiting(same_instant),
        _waiting(younger, leaves_at=now + H),
        _waiting(older, joins_at=now + H / 2),
    ]
    # Not queued yet, it would join now as the youngest: behind its own project's requests, none falls behind it.
    assert queue_ahead(_spec(mine, workload_type="staging"), now=now) == [
        _waiting(moved),
        _waiting(production),
        _waiting(aged),
        _waiting(same_instant),
        _waiting(younger),
        _waiting(mine),
        _waiting(behind),
        _waiting(older, joins_at=now + H / 2),
    ]
    assert queue_ahead(slices, now=now) == []  # the only MIG request waiting
    slice_newcomer = make_request(count=1, target=team_c, actor=operator, workload_type="staging", **MIG)
    assert queue_ahead(slice_newcomer, now=now) == [_waiting(slices)]


def test_nothing_overtakes_a_request_an_operator_moved(world, queued, project, other_project, team_c, now, settings):
    settings.QUEUE_AGED_AFTER_H = 4
    mine = queued(team_c, "staging", 3, manual_rank=2)
    first = queued(project, "staging", 0.5, manual_rank=1)
    queued(project, "staging", 3.5)  # older, but behind a moved request for good
    assert queue_ahead(mine, now=now) == [_waiting(first)]


def _spec(request: PoolRequest, **fields) -> PoolRequest:
    return PoolRequest(
        project=request.project,
        count=1,
        spec_kind=request.spec_kind,
        product=request.product,
        profile_name=request.profile_name,
        tier=request.tier,
        **fields,
    )


@pytest.fixture
def seen(make_request, operator, now):
    """seen(target, workload, h_ago, **fields): a request submitted `h_ago` hours before now."""

    def make(target, workload, h_ago, spec=FULL, count=1, **fields):
        request = make_request(count=count, target=target, actor=operator, workload_type=workload, **spec, **fields)
        PoolRequest.objects.filter(pk=request.pk).update(created_at=now - h_ago * H)
        request.refresh_from_db()
        return request

    return make


def test_arrivals_are_the_requests_of_the_spec_seen_over_the_window_at_their_rate(
    world, seen, project, other_project, team_c, now, settings, make_request, operator
):
    settings.QUEUE_FORECAST_ARRIVALS_WINDOW_H = 168
    AutoApprovalPolicy.objects.create(name="one GPU", max_units=1)
    seen(other_project, "staging", 2.5)  # the first request ever: 2.5 h of observation
    seen(project, "inference", 2, count=2)
    seen(team_c, "staging", 1)
    seen(project, "staging", 0.5)
    seen(other_project, "development", 0.25)
    seen(other_project, "staging", 1, spec=MIG)  # another spec
    seen(other_project, "staging", 1, cluster=world.cluster("west"))  # pinned to west: another spec
    seen(other_project, "staging", 1, state="draft")  # never submitted
    mine = seen(team_c, "staging", 0.1)  # itself
    coming = arrivals(mine, now=now)
    assert coming.rate_h == pytest.approx(5 / 2.5)
    team_a, team_b, team_c = project.pk, other_project.pk, team_c.pk
    assert sorted(coming.samples, key=repr) == sorted(
        [
            Arrival(1, team_b, "staging", ahead=True, auto=True, by_share=True),  # a lower share than team-c's
            Arrival(2, team_a, "inference", ahead=True, auto=False),  # a higher class; two GPUs: no policy
            Arrival(1, team_c, "staging", ahead=False, auto=True),  # the same share: younger, behind
            Arrival(1, team_a, "staging", ahead=False, auto=True),  # a higher share
            Arrival(1, team_b, "development", ahead=False, auto=True),  # a lower class
        ],
        key=repr,
    )
    assert arrivals(mine, now=now, moved=True).ahead_per_h == 0.0  # nothing overtakes a moved request
    # A window shorter than the history: its own hours, and only what came within it.
    settings.QUEUE_FORECAST_ARRIVALS_WINDOW_H = 1
    window = arrivals(mine, now=now)
    assert (window.rate_h, {s.workload for s in window.samples}) == (2.0, {"staging", "development"})
    settings.QUEUE_FORECAST_ARRIVALS_WINDOW_H = 0
    assert arrivals(mine, now=now) == Arrivals(0.0, ())


def test_no_request_ever_made_means_no_arrivals(fleet, project, now):
    fleet.full_node("east-1", gpus=1, cluster="east")
    request = PoolRequest(project=project, count=1, spec_kind="full", product="H100-80GB", profile_name="")
    assert arrivals(request, now=now) == Arrivals(0.0, ())

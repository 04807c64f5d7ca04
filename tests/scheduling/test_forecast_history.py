"""The hold history the forecast draws releases from (scheduling/forecast/history.py): the Kaplan-Meier curve and
its draws, worked out by hand; the hold times read from pools of two clusters and two projects; the scope a
holder's history is taken at; the holders of a spec and how long each has held."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from capacity.models import Allocation, NodeCapacity
from pools import services
from pools.models import GpuPool, PoolRequest
from scheduling.forecast import Holder, Survival, hold_history, hold_samples, holders
from scheduling.forecast.history import remaining_h

FULL = {"isolation": "full", "product": "H100-80GB", "profile_name": ""}
MIG = {"isolation": "mig", "product": "H100-80GB", "profile_name": "3g.40gb"}
H = dt.timedelta(hours=1)


class Uniform:
    """A stand-in for random.Random whose draws are known: random() is `u`, an exponential draw is its mean."""

    def __init__(self, u: float):
        self.u = u

    def random(self) -> float:
        return self.u

    def expovariate(self, lambd: float) -> float:
        return 1 / lambd


def test_the_curve_steps_down_at_each_ended_hold_and_counts_the_censored_at_risk():
    """Ends at 2, 4 (with one pool still held at 4), 6, and one still held at 8: at risk 5, 4, 2 at the ends."""
    survival = Survival([(8.0, False), (4.0, True), (2.0, True), (6.0, True), (4.0, False)])
    assert survival.times == [2.0, 4.0, 6.0]
    assert survival.survival == pytest.approx([4 / 5, 4 / 5 * 3 / 4, 4 / 5 * 3 / 4 * 1 / 2])
    assert (survival.ended, survival.mean) == (3, 4.0)


def test_ties_of_ends_fall_together():
    survival = Survival([(2.0, True), (2.0, True), (4.0, True), (4.0, True)])
    assert (survival.times, survival.survival) == ([2.0, 4.0], [0.5, 0.0])


@pytest.mark.parametrize(("u", "remaining"), [(0.9, 2.0), (0.5, 2.0), (0.25, 4.0), (0.0, 4.0)])
def test_a_draw_is_the_first_hold_whose_survival_is_at_most_the_uniform(u, remaining):
    """Half the pools end at 2 h and half at 4 h: a uniform of 0.5 or more gives 2 h (survival 0.5 is at most
    0.5), less gives 4 h."""
    survival = Survival([(2.0, True), (2.0, True), (4.0, True), (4.0, True)])
    assert survival.remaining(0.0, Uniform(u)) == remaining


@pytest.mark.parametrize(("u", "remaining"), [(0.6, 1.0), (0.4, 3.0)])
def test_a_draw_for_a_pool_held_a_while_is_conditioned_on_its_hold_so_far(u, remaining):
    """Ends at 2, 4, 6 and 8 h: survival 0.75, 0.5, 0.25, 0. Held 5 h, the curve past 5 h is scaled by its
    survival at 5 h (0.5): a uniform of 0.6 aims at 0.3 and ends at 6 h, one of 0.4 at 0.2 and ends at 8 h."""
    survival = Survival([(2.0, True), (4.0, True), (6.0, True), (8.0, True)])
    assert survival.remaining(5.0, Uniform(u)) == remaining


def test_past_the_last_hold_seen_to_end_the_mean_hold_again_at_least_the_overdue_floor(settings):
    settings.QUEUE_FORECAST_OVERDUE_H = 1
    survival = Survival([(3.0, True)] * 5)
    assert survival.remaining(12.0, Uniform(0.5)) == 3.0  # the exponential's mean: the mean hold, 3 h
    two = Survival([(1.0, True), (2.0, True), (3.0, True), (6.0, False)])  # a pool held 6 h outlives them all
    assert two.remaining(2.5, Uniform(0.1)) == pytest.approx(0.5 + 2.0)  # to 3 h, then the mean hold of 2 h
    settings.QUEUE_FORECAST_OVERDUE_H = 5
    assert survival.remaining(12.0, Uniform(0.5)) == 5.0


def test_past_a_short_mean_hold_the_mean_is_drawn_again(settings):
    settings.QUEUE_FORECAST_OVERDUE_H = 0
    survival = Survival([(0.5, True), (0.5, True), (0.5, False), (2.0, False)])  # ended holds of half an hour
    assert survival.remaining(1.0, Uniform(0.3)) == 0.5


def test_a_history_of_pools_still_held_only_gives_the_overdue_floor(settings):
    settings.QUEUE_FORECAST_OVERDUE_H = 2
    survival = Survival([(5.0, False), (7.0, False)])
    assert (survival.times, survival.ended, survival.mean) == ([], 0, 0.0)
    assert survival.remaining(1.0, Uniform(0.5)) == 2.0


def test_hundreds_of_holds_make_one_curve():
    """hold_history reads up to 500 released pools: a curve over more observations than Python caches ints for."""
    survival = Survival([(float(h), True) for h in range(1, 401)])
    assert (len(survival.times), survival.ended, survival.mean) == (400, 400, 200.5)
    assert survival.survival[-1] == 0.0
    assert survival.survival[199] == pytest.approx(0.5)
    assert survival.remaining(0.0, Uniform(0.499)) == 201.0  # the first hold past which at most 49.9 % last


@pytest.fixture
def now():
    return timezone.now().replace(microsecond=0)


@pytest.fixture
def world(fleet):
    """Two clusters (east made first), whole GPUs on each, and a MIG node in west."""
    fleet.full_node("east-1", gpus=2, cluster="east")
    fleet.full_node("west-1", gpus=2, cluster="west")
    fleet.mig_node("west-mig", [["3g.40gb", "3g.40gb"]], cluster="west")
    fleet.full_node("west-a100", gpus=1, cluster="west", product="A100-80GB")
    return fleet


@pytest.fixture
def pool(make_request, operator, now):
    """pool(count, created_h_ago, released_after_h=None, **fields): an approved pool made `created_h_ago` hours
    before now, released `released_after_h` hours after it was made (None: still held)."""

    def make(count=1, created_h_ago=0.0, released_after_h=None, spec=FULL, **fields):
        request = make_request(count=count, **{**spec, **fields})
        made = services.approve(request, actor=operator)
        created = now - created_h_ago * H
        if released_after_h is not None:
            services.release(request, actor=operator)
            GpuPool.objects.filter(pk=made.pk).update(created_at=created, released_at=created + released_after_h * H)
        else:
            GpuPool.objects.filter(pk=made.pk).update(created_at=created)
        return request

    return make


def test_hold_history_reads_hours_of_released_and_held_pools_per_project_and_workload(
    world, pool, project, other_project, charlie, now
):
    pool(created_h_ago=10, released_after_h=1.5, workload_type="training")
    pool(created_h_ago=10, released_after_h=2.25, workload_type="training", target=other_project, actor=charlie)
    pool(created_h_ago=3.75, workload_type="training")  # still held: 3.75 h so far
    pool(created_h_ago=20, released_after_h=0.5, workload_type="inference", target=other_project, actor=charlie)
    history = hold_history(now=now)
    assert set(history) == {
        (project.pk, "training"),
        (other_project.pk, "training"),
        (other_project.pk, "inference"),
        ("training",),
        ("inference",),
        (),
    }
    mine = history[(project.pk, "training")]
    assert (mine.times, mine.survival, mine.ended, mine.mean) == ([1.5], [0.5], 1, 1.5)
    training = history[("training",)]
    assert (training.times, training.ended, training.mean) == ([1.5, 2.25], 2, 1.875)
    assert training.survival == pytest.approx([2 / 3, 1 / 3])  # the pool held 3.75 h is still at risk
    everything = history[()]
    assert (everything.times, everything.ended) == ([0.5, 1.5, 2.25], 3)


def test_hold_history_reads_the_latest_released_pools_up_to_its_limit_and_no_pool_made_after_now(world, pool, now):
    pool(created_h_ago=30, released_after_h=1)  # released 29 h ago: the oldest release
    pool(created_h_ago=10, released_after_h=2)
    pool(created_h_ago=10, released_after_h=3)
    pool(created_h_ago=-1)  # made after `now`: not held yet
    history = hold_history(now=now, limit=2)
    assert (history[()].times, history[()].ended) == ([2.0, 3.0], 2)
    assert len(hold_history(now=now)[()].times) == 3


def test_hold_history_reads_500_released_pools_by_default(world, project, now):
    """The 500 latest releases: of 501 released pools the one released first is left out, the next is read."""
    west = world.cluster("west")
    spec = {"count": 1, "spec_kind": "full", "product": "H100-80GB", "tier": "training", "isolation": "full"}
    requests = PoolRequest.objects.bulk_create(
        PoolRequest(project=project, workload_type="training", state="released", **spec) for _ in range(501)
    )
    holds = [99.0, 2.0] + [1.0] * 499  # in the order of release
    GpuPool.objects.bulk_create(
        GpuPool(
            project=project,
            request=request,
            cluster=west,
            name=f"pool-{n}",
            workload_type="training",
            created_at=now - 200 * H + n * H - hours * H,
            released_at=now - 200 * H + n * H,
        )
        for n, (request, hours) in enumerate(zip(requests, holds, strict=True))
    )
    survival = hold_history(now=now)[()]
    assert (survival.times, survival.ended) == ([1.0, 2.0], 500)


def test_a_release_recorded_before_the_pool_was_made_is_a_hold_of_no_time(world, pool, now):
    """Clocks of two hosts disagree: the release is stamped a little before the creation. The hold is 0 h,
    not a negative one that would end before it began."""
    pool(created_h_ago=10, released_after_h=-0.25)
    pool(created_h_ago=10, released_after_h=2)
    survival = hold_history(now=now)[()]
    assert (survival.times, survival.survival, survival.mean) == ([0.0, 2.0], [0.5, 0.0], 1.0)


def test_hold_samples_takes_the_narrowest_scope_with_enough_ended_holds(settings):
    settings.QUEUE_FORECAST_MIN_SAMPLES = 5
    few, enough, more = (Survival([(1.0, True)] * n) for n in (4, 5, 6))
    assert hold_samples({(7, "training"): enough, ("training",): more, (): more}, 7, "training") == (
        enough,
        "project and workload type",
    )
    assert hold_samples({(7, "training"): more, ("training",): more}, 7, "training") == (
        more,
        "project and workload type",
    )
    assert hold_samples({(7, "training"): few, ("training",): more, (): more}, 7, "training") == (
        more,
        "workload type",
    )
    assert hold_samples({(7, "training"): few, ("training",): few, (): enough}, 7, "training") == (enough, "all")
    assert hold_samples({(8, "training"): more, ("inference",): more, (): few}, 7, "training") == (None, "default")
    censored = Survival([(1.0, True)] * 4 + [(9.0, False)] * 3)  # 7 observations, 4 of them ended: too few
    assert hold_samples({(7, "training"): censored}, 7, "training") == (None, "default")


def test_holders_are_the_pools_of_the_spec_with_their_units_nodes_and_hours_held(
    world, pool, project, other_project, charlie, now
):
    east, west = world.cluster("east"), world.cluster("west")
    mine = pool(count=2, created_h_ago=2.5, cluster=east)
    theirs = pool(created_h_ago=0.5, cluster=west, target=other_project, actor=charlie, end_at=now + 4 * H)
    pool(created_h_ago=1, spec=MIG, cluster=west)  # a MIG slice: not a whole GPU
    pool(created_h_ago=30, released_after_h=1, cluster=west)  # released: holds nothing
    other = pool(created_h_ago=1, cluster=west, product="A100-80GB")  # another product
    skewed = pool(created_h_ago=-0.25, cluster=west, target=other_project, actor=charlie)  # a clock ahead of now's
    request = PoolRequest(project=project, count=1, spec_kind="full", product="H100-80GB", profile_name="")
    found, scopes = holders(request, now=now, history={})
    assert scopes == {"default": 2, "end date": 1}
    by_pool = {h.pool_id: h for h in found}
    east_node, west_node = (NodeCapacity.objects.get(name=name).pk for name in ("east-1", "west-1"))
    mine_pool, theirs_pool, skewed_pool = (GpuPool.objects.get(request=r).pk for r in (mine, theirs, skewed))
    assert by_pool == {
        mine_pool: Holder(2, None, 2.5, None, ((east_node, 2),), mine_pool, project.pk),
        theirs_pool: Holder(1, now + 4 * H, 0.5, None, ((west_node, 1),), theirs_pool, other_project.pk),
        skewed_pool: Holder(1, None, 0.0, None, ((west_node, 1),), skewed_pool, other_project.pk),  # never negative
    }
    pinned = PoolRequest(project=project, count=1, spec_kind="full", product="H100-80GB", profile_name="", cluster=west)
    assert [h.pool_id for h in holders(pinned, now=now, history={})[0]] == [theirs_pool, skewed_pool]
    a100 = PoolRequest(project=project, count=1, spec_kind="full", product="A100-80GB", profile_name="")
    assert [h.pool_id for h in holders(a100, now=now, history={})[0]] == [GpuPool.objects.get(request=other).pk]
    slice_request = PoolRequest(project=project, count=1, spec_kind="mig", product="H100-80GB", profile_name="3g.40gb")
    assert [h.units for h in holders(slice_request, now=now, history={})[0]] == [1]


def test_a_vgpu_request_is_held_up_by_pools_of_its_own_vgpu_type_only(
    world, pool, project, other_project, charlie, now
):
    """A vGPU is carved from a GPU configured for one vGPU type (pools.units.free_vgpus counts per type): a pool of
    another type gives back no unit of this one. The pools' units are relabelled as discovery would record vGPUs."""
    twenty = pool(created_h_ago=1, cluster=world.cluster("east"))
    ten = pool(created_h_ago=2, cluster=world.cluster("west"), target=other_project, actor=charlie)
    for request, vgpu_type in ((twenty, "H100XM-20C"), (ten, "H100XM-10C")):
        Allocation.objects.filter(pool__request=request).update(kind="vgpu", profile_name=vgpu_type)
    for vgpu_type, held_by in (("H100XM-20C", twenty), ("H100XM-10C", ten), ("H100XM-40C", None)):
        request = PoolRequest(project=project, count=1, spec_kind="vgpu", product="H100-80GB", profile_name=vgpu_type)
        found = [h.pool_id for h in holders(request, now=now, history={})[0]]
        assert found == ([] if held_by is None else [GpuPool.objects.get(request=held_by).pk])


def test_holders_draw_from_the_history_given_and_read_it_when_none_is(world, pool, project, now, settings):
    settings.QUEUE_FORECAST_MIN_SAMPLES = 2
    for _ in range(2):
        pool(created_h_ago=10, released_after_h=3, workload_type="training")
    pool(created_h_ago=1, workload_type="training")
    request = PoolRequest(project=project, count=1, spec_kind="full", product="H100-80GB", profile_name="")
    (holder,), scopes = holders(request, now=now)
    assert scopes == {"project and workload type": 1}
    assert (holder.history.times, holder.history.ended) == ([3.0], 2)
    given = {("training",): Survival([(5.0, True)] * 2)}
    (holder,), scopes = holders(request, now=now, history=given)
    assert (scopes, holder.history) == ({"workload type": 1}, given[("training",)])


def test_a_holder_without_history_holds_the_default_less_what_it_held(settings):
    settings.QUEUE_FORECAST_DEFAULT_HOLD_H = 24
    settings.QUEUE_FORECAST_OVERDUE_H = 1
    assert remaining_h(Holder(1, None, 20.0, None), None) == 4.0
    assert remaining_h(Holder(1, None, 23.5, None), None) == 1.0  # overdue: at least the floor
    history = Survival([(2.0, True), (2.0, True), (4.0, True), (4.0, True)])
    assert remaining_h(Holder(1, None, 3.0, history), Uniform(0.5)) == 1.0

"""The start forecast against hand-built histories whose answer is known."""

import datetime as dt
import math
import random

import pytest
from django.utils import timezone

from capacity.models import MaintenanceWindow
from pools import services
from pools.models import Allocation, AutoApprovalPolicy, GpuPool, PoolRequest, QueueEntry
from scheduling import forecast, queue

pytestmark = pytest.mark.django_db

FULL = {"isolation": "full", "product": "H100-80GB", "profile_name": ""}
H = dt.timedelta(hours=1)


@pytest.fixture
def now():
    return timezone.now().replace(microsecond=0)


@pytest.fixture
def hold(make_request, operator, now):
    """hold(count, ends_in_h=None, held_h=0, **fields): an approved pool of whole GPUs, its start moved back."""

    def make(count=1, ends_in_h=None, held_h=0.0, **fields):
        end = now + ends_in_h * H if ends_in_h is not None else None
        request = make_request(count=count, end_at=end, **{**FULL, **fields})
        pool = services.approve(request, actor=operator)
        GpuPool.objects.filter(pk=pool.pk).update(created_at=now - held_h * H)
        return request

    return make


def history(project_workload_hours: list[float], make_request, operator, now, **fields):
    """Released pools that held exactly these many hours (the observed hold times)."""
    for hours in project_workload_hours:
        request = make_request(count=1, **{**FULL, **fields})
        pool = services.approve(request, actor=operator)
        services.release(request, actor=operator)
        GpuPool.objects.filter(pk=pool.pk).update(created_at=now - 100 * H, released_at=now - 100 * H + hours * H)


def ask(count=1, **fields) -> PoolRequest:
    """A request not yet made, resolved as the API's dry run resolves it."""
    from tenancy.models import Project

    spec = services.resolve_spec(isolation="full", product="H100-80GB")
    return PoolRequest(
        project=Project.objects.first(),
        count=count,
        spec_kind=spec.spec_kind,
        product=spec.product,
        tier=spec.tier,
        isolation=spec.isolation,
        **fields,
    )


def test_a_request_that_fits_starts_now(fleet, now):
    fleet.full_node("t1", gpus=2)
    estimate = forecast.estimate_start(ask(2, start_at=now), now=now)
    assert (estimate.p50, estimate.p90) == (now, now)
    assert estimate.basis["why"] == "fits now"


def test_known_end_dates_give_the_start(fleet, hold, now):
    fleet.full_node("t1", gpus=2)
    hold(ends_in_h=2)
    hold(ends_in_h=5)
    assert forecast.estimate_start(ask(1), now=now).p50 == now + 2 * H
    two = forecast.estimate_start(ask(2), now=now)
    assert (two.p50, two.p90) == (now + 5 * H, now + 5 * H)
    assert forecast.estimate_start(ask(3), now=now).p50 is None  # more than the fleet holds


def test_requests_ahead_in_the_queue_take_the_first_units(fleet, hold, make_request, now):
    fleet.full_node("t1", gpus=2)
    hold(ends_in_h=2)
    hold(ends_in_h=5)
    ahead = make_request(count=1, wait_if_full=True, **FULL)
    queue.enqueue(ahead)
    assert QueueEntry.objects.get(request=ahead).first_p50 is not None
    estimate = forecast.estimate_start(ask(1), now=now)
    assert estimate.basis["ahead"] == 1
    assert estimate.p50 == now + 5 * H


def test_open_ended_pools_end_as_the_projects_history_says(fleet, hold, make_request, operator, now):
    fleet.full_node("t1", gpus=1)
    history([10] * 5, make_request, operator, now, workload_type="training")
    hold(held_h=4, workload_type="training")
    estimate = forecast.estimate_start(ask(1), now=now)
    assert (estimate.p50, estimate.p90) == (now + 6 * H, now + 6 * H)  # held 4 of its 10 hours
    assert estimate.basis["holders_by_basis"] == {"project and workload type": 1}


def test_a_pool_held_longer_than_any_seen_to_end_holds_the_mean_hold_again(
    fleet, hold, make_request, operator, now, settings
):
    settings.QUEUE_FORECAST_DRAWS = 2000
    fleet.full_node("t1", gpus=1)
    history([3] * 5, make_request, operator, now)
    hold(held_h=12)
    # Past every hold seen to end, the remaining hold is memoryless with the mean hold (3 h): median 3 ln 2.
    p50 = forecast.estimate_start(ask(1), now=now).p50
    assert abs((p50 - now) / H - 3 * math.log(2)) < 0.2


def test_pools_still_held_count_as_holds_at_least_that_long():
    """Kaplan-Meier: five holds of 2 h ended, five pools held 20 h and still going. Half the pools are seen
    to last past 2 h, so half the drawn holds do; the ended holds alone would say every pool ends at 2 h."""
    survival = forecast.Survival([(2.0, True)] * 5 + [(20.0, False)] * 5)
    rng = random.Random(1)
    draws = [survival.remaining(0.0, rng) for _ in range(4000)]
    assert set(d for d in draws if d <= 2.0) == {2.0}
    assert 0.46 < sum(d > 2.0 for d in draws) / len(draws) < 0.54
    assert all(d >= 2.0 for d in draws)
    ended_only = forecast.Survival([(2.0, True)] * 5)
    assert {ended_only.remaining(0.0, rng) for _ in range(100)} == {2.0}


def test_the_spread_of_history_gives_p50_and_p90(fleet, hold, make_request, operator, now, settings):
    settings.QUEUE_FORECAST_DRAWS = 1000
    fleet.full_node("t1", gpus=1)
    history([2, 4, 6, 8, 10] * 2, make_request, operator, now)
    hold(held_h=0)
    estimate = forecast.estimate_start(ask(1), now=now)
    assert estimate.p50 == now + 6 * H  # the median of draws among five equally likely hold times
    assert estimate.p90 == now + 10 * H


def test_with_no_history_an_open_ended_pool_holds_the_default(fleet, hold, now, settings):
    settings.QUEUE_FORECAST_DEFAULT_HOLD_H = 24
    fleet.full_node("t1", gpus=1)
    hold(held_h=20)
    assert forecast.estimate_start(ask(1), now=now).p50 == now + 4 * H


def test_a_start_inside_a_maintenance_window_moves_to_its_close(fleet, hold, now):
    node = fleet.full_node("t1", gpus=1)
    hold(ends_in_h=2)
    MaintenanceWindow.objects.create(cluster=node.cluster, name="firmware", starts_at=now + 1 * H, ends_at=now + 3 * H)
    assert forecast.estimate_start(ask(1), now=now).p50 == now + 3 * H


def test_accuracy_compares_the_first_p50_with_the_actual_start(fleet, make_request, operator, now):
    fleet.full_node("t1", gpus=2)
    for wait_h, predicted_h in ((4, 5), (2, 2), (7, None)):  # the last had no start within the horizon
        request = make_request(count=1, wait_if_full=True, **FULL)
        services.transition(request, "queued", None, "queued")
        QueueEntry.objects.create(
            request=request,
            queued_at=now,
            first_p50=None if predicted_h is None else now + predicted_h * H,
            first_p90=None if predicted_h is None else now + 9 * H,
        )
        PoolRequest.objects.filter(pk=request.pk).update(approved_at=now + wait_h * H)
    score = forecast.accuracy()
    assert score == {
        "started": 2,
        "mae_h": 0.5,
        "mean_wait_h": 3.0,
        "mae_ratio": 0.167,
        "within_p90": 1.0,
        "ran_on_loan_first": 0,
        "mean_wait_to_loan_h": None,
        "without_forecast": 1,
    }


def test_accuracy_scores_a_request_that_ran_on_lent_units_by_its_own_start(fleet, make_request, now):
    """The forecast predicts the start on the request's own units: a start on lent units is reported beside it."""
    fleet.full_node("t1", gpus=1)
    request = make_request(count=1, wait_if_full=True, **FULL)
    services.transition(request, "queued", None, "queued")
    QueueEntry.objects.create(
        request=request, queued_at=now, first_p50=now + 5 * H, first_p90=now + 9 * H, first_on_loan_at=now + 1 * H
    )
    PoolRequest.objects.filter(pk=request.pk).update(approved_at=now + 4 * H)
    score = forecast.accuracy()
    assert (score["started"], score["mae_h"], score["mean_wait_h"]) == (1, 1.0, 4.0)
    assert (score["ran_on_loan_first"], score["mean_wait_to_loan_h"]) == (1, 1.0)


def test_later_arrivals_of_a_higher_class_push_the_start_back(fleet, hold, make_request, other_project, charlie, now):
    fleet.full_node("t1", gpus=2)
    hold(ends_in_h=2)
    hold(ends_in_h=4)
    # team-b asked for 10 production GPUs over the last 100 hours: 0.1 an hour that would rank ahead of development.
    for i in range(10):
        request = make_request(count=1, target=other_project, actor=charlie, workload_type="inference", **FULL)
        PoolRequest.objects.filter(pk=request.pk).update(created_at=now - (100 - 10 * i) * H)
    alone = forecast.estimate_start(ask(1, workload_type="inference"), now=now)
    assert alone.basis["arrivals_ahead_per_h"] == 0.0  # same class, same fair share: not ahead
    assert (alone.p50, alone.p90) == (now + 2 * H, now + 2 * H)
    # For development, none by 2 h with probability e^-0.2 = 0.82; one before 2 h and none in 2-4 h: 0.13.
    estimate = forecast.estimate_start(ask(1, workload_type="development"), now=now)
    assert estimate.basis["arrivals_ahead_per_h"] == 0.1
    assert (estimate.p50, estimate.p90) == (now + 2 * H, now + 4 * H)


def test_multi_gpu_work_starts_when_one_node_has_its_count_free(fleet, hold, other_project, charlie, now):
    fleet.full_node("t1", gpus=2)
    fleet.full_node("t2", gpus=2)
    hold(ends_in_h=1)  # team-a on t1
    hold(ends_in_h=2, target=other_project, actor=charlie)  # team-b goes to the node team-a does not use: t2
    hold(ends_in_h=3)  # t1
    hold(ends_in_h=4, target=other_project, actor=charlie)  # t2
    # Two GPUs are free at 2 h, on two nodes; t1 has both at 3 h.
    assert forecast.estimate_start(ask(2), now=now).p50 == now + 3 * H


def test_a_young_system_observes_arrivals_over_at_least_an_hour(fleet, hold, make_request, other_project, charlie, now):
    fleet.full_node("t1", gpus=1)
    hold(ends_in_h=2)
    for _ in range(3):  # three production requests of team-b in the last seconds, and nothing before
        make_request(count=1, target=other_project, actor=charlie, workload_type="inference", **FULL)
    estimate = forecast.estimate_start(ask(1, workload_type="development"), now=timezone.now())
    # Team-b's three and the held pool's own request (inference, production) rank ahead of development.
    assert estimate.basis["arrivals_ahead_per_h"] == 4.0


def test_a_request_behind_a_larger_head_waits_for_the_head_to_start(fleet, hold, make_request, operator, now):
    fleet.full_node("t1", gpus=2)
    history([10] * 5, make_request, operator, now)
    hold(ends_in_h=1)
    hold(ends_in_h=3)
    head = make_request(count=2, wait_if_full=True, **FULL)
    queue.enqueue(head)
    # One GPU is free at 1 h, but the head needs both: it blocks its spec until 3 h, then holds them 10 h.
    estimate = forecast.estimate_start(ask(1), now=now)
    assert estimate.basis["ahead"] == 2
    assert (estimate.p50, estimate.p90) == (now + 13 * H, now + 13 * H)


def test_a_dry_run_is_placed_where_the_queue_would_place_it(fleet, hold, make_request, operator, now):
    fleet.full_node("t1", gpus=1)
    history([10] * 5, make_request, operator, now, workload_type="development")
    hold(ends_in_h=2)
    waiting = make_request(count=1, wait_if_full=True, workload_type="development", **FULL)
    queue.enqueue(waiting)
    production = forecast.estimate_start(ask(1, workload_type="inference"), now=now)
    assert (production.basis["ahead"], production.p50) == (0, now + 2 * H)  # ahead of the development request
    development = forecast.estimate_start(ask(1, workload_type="development"), now=now)
    assert (development.basis["ahead"], development.p50) == (1, now + 12 * H)  # behind it: 2 h, then its 10 h


def test_arrivals_a_policy_approves_take_units_freed_while_the_head_cannot_start(
    fleet, hold, make_request, other_project, charlie, operator, now, settings
):
    """The queue's head needs two GPUs of one node; one-GPU requests arriving by policy take each GPU
    as it frees (scheduling.queue.after_submit approves what fits), so the head does not start at 3 h."""
    settings.QUEUE_FORECAST_HORIZON_H = 48
    settings.QUEUE_FORECAST_DRAWS = 40
    fleet.full_node("t1", gpus=2)
    history([10] * 5, make_request, operator, now)
    hold(ends_in_h=1)
    hold(ends_in_h=3)
    for i in range(20):  # team-b asks for one GPU three times an hour
        request = make_request(count=1, target=other_project, actor=charlie, **FULL)
        PoolRequest.objects.filter(pk=request.pk).update(created_at=now - (20 - i) * H / 3)
    without_policy = forecast.estimate_start(ask(2), now=now)
    assert (without_policy.p50, without_policy.p90) == (now + 3 * H, now + 3 * H)

    AutoApprovalPolicy.objects.create(name="one GPU", max_units=1)
    starved = forecast.estimate_start(ask(2), now=now)
    assert starved.basis["arrivals_per_h"] == 3.0
    assert starved.p90 is None  # some draw never frees both GPUs at once within the horizon
    assert starved.p50 is None or starved.p50 > now + 3 * H


def _held_for_20_h(request, now) -> None:
    """The pool's units count in its project's fair share from 20 hours back (its hold history is unchanged)."""
    Allocation.objects.filter(pool__request=request).update(allocated_at=now - 20 * H)


def _queued(request, now, waited_h: float) -> PoolRequest:
    queue.enqueue(request)
    QueueEntry.objects.filter(request=request).update(queued_at=now - waited_h * H)
    return request


@pytest.mark.parametrize(("aged_after_h", "start_h"), [(4, 2), (0, 12)])
def test_a_younger_request_ahead_by_fair_share_falls_behind_when_this_one_is_aged(
    fleet, hold, make_request, operator, other_project, charlie, now, settings, aged_after_h, start_h
):
    settings.QUEUE_FORECAST_ARRIVALS_WINDOW_H = 0  # the queue's own moves only
    settings.QUEUE_AGED_AFTER_H = aged_after_h
    fleet.full_node("t1", gpus=1)
    history([10] * 5, make_request, operator, now)
    history([10] * 5, make_request, operator, now, target=other_project, actor=charlie)  # team-b's holds too
    _held_for_20_h(hold(ends_in_h=2), now)  # team-a holds the GPU: its fair share is the higher
    mine = _queued(make_request(count=1, wait_if_full=True, **FULL), now, waited_h=3)  # aged at 1 h
    theirs = _queued(make_request(count=1, wait_if_full=True, target=other_project, actor=charlie, **FULL), now, 1)
    estimate = forecast.estimate_start(mine, now=now)
    assert estimate.basis["ahead"] == 1  # team-b's, by fair share, for now
    # Aged at 1 h, mine is ahead when the GPU frees at 2 h; never aged, team-b's takes it for its 10 h first.
    assert (estimate.p50, estimate.p90) == (now + start_h * H, now + start_h * H)
    assert forecast.estimate_start(theirs, now=now).p50 == now + (12 if aged_after_h else 2) * H


@pytest.mark.parametrize(("aged_after_h", "start_h"), [(4, 12), (0, 2)])
def test_an_older_request_behind_by_fair_share_comes_ahead_when_it_is_aged(
    fleet, hold, make_request, operator, other_project, charlie, now, settings, aged_after_h, start_h
):
    settings.QUEUE_FORECAST_ARRIVALS_WINDOW_H = 0
    settings.QUEUE_AGED_AFTER_H = aged_after_h
    fleet.full_node("t1", gpus=1)
    history([10] * 5, make_request, operator, now)
    history([10] * 5, make_request, operator, now, target=other_project, actor=charlie)  # team-b's holds too
    _held_for_20_h(hold(ends_in_h=2), now)
    _queued(make_request(count=1, wait_if_full=True, **FULL), now, waited_h=3.5)  # team-a's, aged at 0.5 h
    theirs = _queued(make_request(count=1, wait_if_full=True, target=other_project, actor=charlie, **FULL), now, 1)
    estimate = forecast.estimate_start(theirs, now=now)
    assert estimate.basis["ahead"] == 0  # ahead of team-a's by fair share, for now
    assert (estimate.p50, estimate.p90) == (now + start_h * H, now + start_h * H)


@pytest.mark.parametrize(("aged_after_h", "overtaken"), [(4, False), (0, True)])
def test_arrivals_ahead_by_fair_share_overtake_a_request_only_until_it_is_aged(
    fleet, hold, make_request, operator, other_project, charlie, now, settings, aged_after_h, overtaken
):
    settings.QUEUE_AGED_AFTER_H = aged_after_h
    fleet.full_node("t1", gpus=1)
    history([10] * 5, make_request, operator, now)
    history([10] * 5, make_request, operator, now, target=other_project, actor=charlie)  # team-b's holds too
    _held_for_20_h(hold(ends_in_h=2), now)
    mine = _queued(make_request(count=1, wait_if_full=True, **FULL), now, waited_h=4 - 1 / 60)  # aged in a minute
    for i in range(30):  # team-b (no GPU-hours: the lower share) asks for one GPU three times an hour
        request = make_request(count=1, target=other_project, actor=charlie, **FULL)
        PoolRequest.objects.filter(pk=request.pk).update(created_at=now - (30 - i) * H / 3)
    estimate = forecast.estimate_start(mine, now=now)
    assert estimate.basis["arrivals_ahead_per_h"] == 3.0
    # Aged in a minute, one arrives before that in 5 % of the draws: the GPU freed at 2 h is its own. Never
    # aged, one arrives within 2 h in 99.8 % and takes it, and the queue ahead grows faster than it drains.
    if overtaken:
        assert estimate.p50 is None
    else:
        assert (estimate.p50, estimate.p90) == (now + 2 * H, now + 2 * H)


@pytest.mark.parametrize(("head_ends_in_h", "start_h"), [(10, 10), (1, 2)])
def test_a_head_with_an_end_date_holds_until_it_unless_the_end_came_while_it_waited(
    fleet, hold, make_request, other_project, charlie, now, settings, head_ends_in_h, start_h
):
    settings.QUEUE_FORECAST_ARRIVALS_WINDOW_H = 0  # the queue's own moves only
    fleet.full_node("t1", gpus=1)
    hold(ends_in_h=2)
    end = now + head_ends_in_h * H
    ahead = make_request(count=1, wait_if_full=True, end_at=end, target=other_project, actor=charlie, **FULL)
    _queued(ahead, now, waited_h=1)
    estimate = forecast.estimate_start(ask(1), now=now)
    assert estimate.basis["ahead"] == 1
    # Team-b's request takes the GPU at 2 h and holds it to its end at 10 h; one that ends at 1 h, before the GPU
    # frees, never starts, and the GPU is this request's at 2 h.
    assert (estimate.p50, estimate.p90) == (now + start_h * H, now + start_h * H)


@pytest.mark.parametrize(("holder", "start_h"), [("team-a", 3), ("team-b", 10)])
def test_one_gpu_goes_first_to_a_node_no_other_project_holds(
    fleet, hold, make_request, project, other_project, charlie, now, settings, holder, start_h
):
    """Approval gives one whole GPU first on the lowest node where no other project holds units (its own may);
    the forecast takes it there too. One GPU of t1 is held to 3 h, its other and t2's are free: team-b's queued
    request takes t2's when team-a holds t1's, and t1's when team-b itself does. Team-a's two GPUs are then free
    together on t1 at 3 h, or only when team-b's request ends at 10 h."""
    settings.QUEUE_FORECAST_ARRIVALS_WINDOW_H = 0  # the queue's own moves only
    t1 = fleet.full_node("t1", gpus=2)
    fleet.full_node("t2", gpus=1)
    owner = {"team-a": {}, "team-b": {"target": other_project, "actor": charlie}}[holder]
    hold(ends_in_h=3, **owner)
    assert list(Allocation.objects.values_list("gpu__node", flat=True)) == [t1.pk]
    ahead = make_request(count=1, wait_if_full=True, end_at=now + 10 * H, target=other_project, actor=charlie, **FULL)
    _queued(ahead, now, waited_h=1)
    estimate = forecast.estimate_start(ask(2), now=now)
    assert estimate.basis["ahead"] == 1
    assert (estimate.p50, estimate.p90) == (now + start_h * H, now + start_h * H)


def test_an_older_request_aged_the_instant_the_gpu_frees_takes_it(
    fleet, hold, make_request, operator, other_project, charlie, now, settings
):
    settings.QUEUE_FORECAST_ARRIVALS_WINDOW_H = 0
    settings.QUEUE_AGED_AFTER_H = 4
    fleet.full_node("t1", gpus=1)
    history([10] * 5, make_request, operator, now)
    history([10] * 5, make_request, operator, now, target=other_project, actor=charlie)  # team-b's holds too
    _held_for_20_h(hold(ends_in_h=2), now)
    _queued(make_request(count=1, wait_if_full=True, **FULL), now, waited_h=2)  # team-a's, aged at 2 h
    theirs = _queued(make_request(count=1, wait_if_full=True, target=other_project, actor=charlie, **FULL), now, 1)
    estimate = forecast.estimate_start(theirs, now=now)
    assert estimate.basis["ahead"] == 0  # ahead of team-a's by fair share, for now
    # The GPU frees at 2 h, the instant team-a's is aged: it joins the queue ahead before that pass and holds the
    # GPU its 10 h.
    assert (estimate.p50, estimate.p90) == (now + 12 * H, now + 12 * H)


def test_older_requests_join_the_queue_ahead_each_when_it_is_aged(
    fleet, hold, make_request, other_project, charlie, now, settings
):
    settings.QUEUE_FORECAST_ARRIVALS_WINDOW_H = 0
    settings.QUEUE_AGED_AFTER_H = 8
    fleet.full_node("t1", gpus=1)
    _held_for_20_h(hold(ends_in_h=2), now)
    # Team-a's two, behind team-b's by fair share for now: aged at 0.5 h (ends at 6 h) and at 5 h (ends at 9 h).
    first = make_request(count=1, wait_if_full=True, end_at=now + 6 * H, **FULL)
    _queued(first, now, waited_h=7.5)
    second = make_request(count=1, wait_if_full=True, end_at=now + 9 * H, **FULL)
    _queued(second, now, waited_h=3)
    theirs = _queued(make_request(count=1, wait_if_full=True, target=other_project, actor=charlie, **FULL), now, 1)
    estimate = forecast.estimate_start(theirs, now=now)
    assert estimate.basis["ahead"] == 0
    # The first joins at 0.5 h and holds the GPU from 2 h to 6 h; the second joins at 5 h and holds it to 9 h.
    assert (estimate.p50, estimate.p90) == (now + 9 * H, now + 9 * H)


def test_a_head_whose_end_came_is_dropped_at_the_next_pass_not_when_this_request_is_aged(
    fleet, hold, make_request, other_project, charlie, now, settings
):
    """Team-b's one-GPU request takes a free GPU now; its two-GPU request behind it blocks the spec, and its end
    comes at 1 h while it waits. The next pass is at 5 h, when team-a's GPU frees: the ended request is dropped
    there and this one starts. This request's own aging (at 2 h) reorders nothing here, so it is no pass."""
    settings.QUEUE_FORECAST_ARRIVALS_WINDOW_H = 0
    settings.QUEUE_AGED_AFTER_H = 2
    fleet.full_node("t1", gpus=3)
    _held_for_20_h(hold(ends_in_h=5), now)  # team-a's: its fair share is the higher
    one = make_request(count=1, wait_if_full=True, end_at=now + 8 * H, target=other_project, actor=charlie, **FULL)
    _queued(one, now, waited_h=1)
    two = make_request(count=2, wait_if_full=True, end_at=now + 1 * H, target=other_project, actor=charlie, **FULL)
    _queued(two, now, waited_h=0.5)
    estimate = forecast.estimate_start(ask(1), now=now)
    assert (estimate.basis["free_now"], estimate.basis["ahead"]) == (2, 3)
    assert (estimate.p50, estimate.p90) == (now + 5 * H, now + 5 * H)

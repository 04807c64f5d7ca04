"""The queue's order on a fleet like a real one (#32): fair share from GPU-hours held over the window on two
clusters and three kinds of unit (MIG, time-slice, whole GPU), weights, ageing, operator ranks and classes."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest
from django.utils import timezone
from pool_world import Fleet

from capacity.choices import SpecKind
from pools.choices import PriorityClass, RequestState
from pools.models import Allocation, GpuPool, PoolRequest, ProjectQueueWeight, QueueEntry
from scheduling.policy import Place, queue_policy
from tenancy.models import Project

pytestmark = pytest.mark.django_db
NOW = timezone.now().replace(microsecond=0)


@pytest.fixture
def projects(db):
    # The project ids are not those of the first units; the lowest id is not created first.
    return {
        slug: Project.objects.create(pk=pk, name=slug.title(), slug=slug, namespace=f"team-{slug}")
        for slug, pk in (("gamma", 823), ("alpha", 821), ("beta", 822))
    }


@pytest.fixture
def units(db):
    """c1: an H100 node with MIG 3g.40gb, 2g.20gb, 1g.10gb; c2: a time-slice node (4 replicas) and a whole-GPU node."""
    fleet = Fleet()
    fleet.full_node("warm-up", gpus=3, cluster="c0")  # GPU ids run ahead of MIG instance ids
    mig = fleet.mig_node("c1-mig", [["3g.40gb", "2g.20gb", "1g.10gb"]], cluster="c1")
    shared = fleet.timeslice_node("c2-ts", gpus=1, replicas=4, cluster="c2")
    whole = fleet.full_node("c2-full", gpus=1, cluster="c2", product="A100-80GB")
    instances = {m.profile.name: m for m in mig.gpus.get().mig_instances.select_related("profile")}
    return {"mig": instances, "ts_gpu": shared.gpus.get(), "full": whole.gpus.get()}


def _hold(project, gpu, *, start, end=None, kind=SpecKind.FULL, mig=None, replica=0):
    request = PoolRequest.objects.create(project=project, name="r", cluster=gpu.node.cluster)
    pool = GpuPool.objects.create(
        project=project, request=request, cluster=gpu.node.cluster, name=f"p{request.pk}", workload_type="inference"
    )
    fields = {"resource_name": "nvidia.com/gpu", "compute_slices": 7}
    if mig is not None:
        kind = SpecKind.MIG
        fields = {
            "mig_instance": mig,
            "resource_name": mig.profile.resource_name,
            "profile_name": mig.profile.name,
            "compute_slices": mig.profile.compute_slices,
        }
    return Allocation.objects.create(
        pool=pool,
        project=project,
        gpu=gpu,
        product=gpu.catalog_product,
        kind=kind,
        replica=replica,
        allocated_at=start,
        released_at=end,
        **fields,
    )


def hours_ago(h: float) -> dt.datetime:
    return NOW - dt.timedelta(hours=h)


def test_recent_gpu_hours_weigh_each_kind_and_clip_to_the_window(projects, units, settings):
    settings.QUEUE_FAIR_SHARE_WINDOW_H = 24
    alpha, beta, gamma = projects["alpha"], projects["beta"], projects["gamma"]
    three_g, one_g = units["mig"]["3g.40gb"], units["mig"]["1g.10gb"]
    # alpha: a whole A100 for the last 2 h, and one from before the window to 10 h ago (14 h of it counts).
    _hold(alpha, units["full"], start=hours_ago(2))
    _hold(alpha, units["full"], start=hours_ago(40), end=hours_ago(10), replica=1)
    # beta: a time-slice replica (1/4 GPU) for 4 h; one released before the window; one not started yet.
    _hold(beta, units["ts_gpu"], start=hours_ago(8), end=hours_ago(4), kind=SpecKind.TIMESLICE, replica=0)
    _hold(beta, units["ts_gpu"], start=hours_ago(30), end=hours_ago(25), kind=SpecKind.TIMESLICE, replica=1)
    _hold(beta, units["ts_gpu"], start=NOW + dt.timedelta(hours=1), kind=SpecKind.TIMESLICE, replica=2)
    # gamma: a 3g.40gb (half an H100: its memory) for 7 h, still held, and a 1g.10gb (1/7) for 7 h ending now.
    _hold(gamma, three_g.gpu, start=hours_ago(7), mig=three_g)
    _hold(gamma, one_g.gpu, start=hours_ago(7), end=NOW, mig=one_g)

    hours = queue_policy.recent_gpu_hours([alpha.pk, beta.pk, gamma.pk, 999], now=NOW)

    assert hours == pytest.approx({alpha.pk: 16.0, beta.pk: 1.0, gamma.pk: 4.5, 999: 0.0})


def test_fair_share_divides_by_the_weight(projects, units, settings):
    settings.QUEUE_FAIR_SHARE_WINDOW_H = 24
    alpha, beta = projects["alpha"], projects["beta"]
    _hold(alpha, units["full"], start=hours_ago(6))
    _hold(beta, units["full"], start=hours_ago(6), end=hours_ago(3), replica=1)
    ProjectQueueWeight.objects.create(project=alpha, weight=3)

    assert queue_policy.fair_shares([alpha.pk, beta.pk], now=NOW) == pytest.approx({alpha.pk: 2.0, beta.pk: 3.0})


def test_a_request_ages_exactly_at_the_limit_and_never_without_one(settings):
    settings.QUEUE_AGED_AFTER_H = 2
    queued = hours_ago(5)
    assert queue_policy.aged_at(queued) == hours_ago(3)
    assert queue_policy.is_aged(queued, hours_ago(3)) is True
    assert queue_policy.is_aged(queued, hours_ago(3) - dt.timedelta(seconds=1)) is False
    settings.QUEUE_AGED_AFTER_H = 0
    assert queue_policy.aged_at(queued) is None
    assert queue_policy.is_aged(queued, NOW) is False


def _queued(project, *, queued_at, priority=PriorityClass.PRODUCTION, rank=None, units):
    request = PoolRequest.objects.create(
        project=project,
        name=f"q-{project.slug}",
        cluster=units["full"].node.cluster,
        state=RequestState.QUEUED,
        priority_class=priority,
        count=1,
    )
    QueueEntry.objects.create(request=request, queued_at=queued_at, manual_rank=rank)
    return request.pk


def test_the_order_is_ranks_then_class_then_aged_then_fair_share_then_age(projects, units, settings):
    settings.QUEUE_FAIR_SHARE_WINDOW_H = 24
    settings.QUEUE_AGED_AFTER_H = 3
    alpha, beta, gamma = projects["alpha"], projects["beta"], projects["gamma"]
    _hold(alpha, units["full"], start=hours_ago(6))  # alpha: 6 GPU-hours, the highest share
    _hold(beta, units["full"], start=hours_ago(6), end=hours_ago(4), replica=1)  # beta: 2
    # gamma holds nothing: share 0.
    kw = {"units": units}
    dev_first = _queued(gamma, queued_at=hours_ago(0.1), priority=PriorityClass.DEVELOPMENT, **kw)
    ranked_2 = _queued(gamma, queued_at=hours_ago(0.2), priority=PriorityClass.DEVELOPMENT, rank=2, **kw)
    ranked_1 = _queued(alpha, queued_at=hours_ago(0.3), rank=1, **kw)
    aged_alpha = _queued(alpha, queued_at=hours_ago(5), **kw)  # aged: ahead of every younger production one
    aged_beta = _queued(beta, queued_at=hours_ago(4), **kw)  # aged too, younger: by age, not by share
    young_alpha = _queued(alpha, queued_at=hours_ago(1), **kw)
    young_beta = _queued(beta, queued_at=hours_ago(0.5), **kw)  # lower share than alpha: first
    young_gamma_late = _queued(gamma, queued_at=hours_ago(0.25), **kw)  # lowest share
    young_gamma_early = _queued(gamma, queued_at=hours_ago(0.75), **kw)  # same share, earlier
    staging = _queued(beta, queued_at=hours_ago(2), priority=PriorityClass.STAGING, **kw)

    places = queue_policy.ordered(now=NOW)

    assert [p.entry.request_id for p in places] == [
        ranked_1,
        ranked_2,
        aged_alpha,
        aged_beta,
        young_gamma_early,
        young_gamma_late,
        young_beta,
        young_alpha,
        staging,
        dev_first,
    ]
    assert [p.position for p in places] == list(range(1, 11))
    assert [(p.aged, p.fair_share) for p in places[2:4]] == [(True, pytest.approx(6.0)), (True, pytest.approx(2.0))]
    assert places[7].fair_share == pytest.approx(6.0) and places[7].aged is False
    assert queue_policy.position_of(PoolRequest.objects.get(pk=young_beta)) == 7
    assert queue_policy.position_of(PoolRequest.objects.create(project=beta, name="n", count=1)) is None


def test_requests_with_the_same_key_compete(projects, units):
    request = PoolRequest.objects.create(
        project=projects["alpha"], name="k", cluster=units["full"].node.cluster, spec_kind="full", product="A100-80GB"
    )
    assert queue_policy.spec_key(request) == ("full", "A100-80GB", "", request.tier, units["full"].node.cluster_id)


def test_a_hold_shorter_than_an_hour_counts_its_minutes(projects, units, settings):
    settings.QUEUE_FAIR_SHARE_WINDOW_H = 24
    alpha, beta = projects["alpha"], projects["beta"]
    _hold(alpha, units["full"], start=hours_ago(0.5))  # a whole GPU for the last 30 minutes
    _hold(beta, units["ts_gpu"], start=hours_ago(2), end=hours_ago(1.75), kind=SpecKind.TIMESLICE, replica=0)

    hours = queue_policy.recent_gpu_hours([alpha.pk, beta.pk], now=NOW)

    assert hours == pytest.approx({alpha.pk: 0.5, beta.pk: 0.25 * 0.25})


def test_a_vgpu_counts_its_types_share_and_a_time_slice_on_a_node_without_replicas_a_whole_gpu(
    projects, units, settings
):
    """The fair share counts a held unit as billing and the screens do (capacity.mig.share.held_share): a vGPU is
    1 / its type's vGPUs per GPU (A100D-20C: 4 per GPU), whatever the node's time-slice replicas; a time-slice
    replica on a node whose replicas were since set to 0 counts a whole GPU."""
    settings.QUEUE_FAIR_SHARE_WINDOW_H = 24
    alpha, beta = projects["alpha"], projects["beta"]
    vgpu = _hold(alpha, units["full"], start=hours_ago(4), end=hours_ago(2), kind=SpecKind.VGPU)
    Allocation.objects.filter(pk=vgpu.pk).update(profile_name="A100D-20C")
    _hold(beta, units["ts_gpu"], start=hours_ago(3), end=hours_ago(1), kind=SpecKind.TIMESLICE)
    units["ts_gpu"].node.__class__.objects.filter(pk=units["ts_gpu"].node_id).update(timeslice_replicas=0)

    hours = queue_policy.recent_gpu_hours([alpha.pk, beta.pk], now=NOW)

    assert hours == pytest.approx({alpha.pk: 2 * 0.25, beta.pk: 2.0})


def test_a_row_released_before_it_was_allocated_takes_no_hours_off_the_others(projects, units, settings):
    """A clock stepped back between allocation and release: the row holds nothing, and it is summed with the
    project's other whole-GPU rows, so it must not subtract from them (or make a share negative)."""
    settings.QUEUE_FAIR_SHARE_WINDOW_H = 24
    alpha, beta = projects["alpha"], projects["beta"]
    _hold(alpha, units["full"], start=hours_ago(3), end=hours_ago(1))
    _hold(alpha, units["full"], start=hours_ago(2), end=hours_ago(5), replica=1)  # released 3 h "before"
    _hold(beta, units["full"], start=hours_ago(2), end=hours_ago(6), replica=2)  # only such a row

    hours = queue_policy.recent_gpu_hours([alpha.pk, beta.pk], now=NOW)

    assert hours == pytest.approx({alpha.pk: 2.0, beta.pk: 0.0})


def _place(priority, *, share=1.0, aged=False, manual_rank=None) -> Place:
    entry = SimpleNamespace(request=SimpleNamespace(effective_priority=priority), manual_rank=manual_rank)
    return Place(entry, 1, share, aged)


RANK = queue_policy.PRIORITY_RANK
PROD, STAGING, DEV = PriorityClass.PRODUCTION, PriorityClass.STAGING, PriorityClass.DEVELOPMENT


def test_a_waiting_request_is_ahead_of_a_newcomer_by_class_then_by_age_or_a_share_no_higher():
    """What the forecast asks of each waiting request: is it served before a request that joins now?"""
    ahead = queue_policy.ahead_of_newcomer
    assert ahead(_place(PROD, share=50.0), rank=RANK[STAGING], share=0.0) is True  # a higher class, any share
    assert ahead(_place(STAGING, share=0.0), rank=RANK[PROD], share=50.0) is False  # a lower class, any share
    assert ahead(_place(DEV, share=9.0, manual_rank=3), rank=RANK[PROD], share=0.0) is True  # moved by an operator
    assert ahead(_place(STAGING, share=2.0), rank=RANK[STAGING], share=2.0) is True  # same share: it is older
    assert ahead(_place(STAGING, share=2.5), rank=RANK[STAGING], share=2.0) is False
    assert ahead(_place(STAGING, share=2.5, aged=True), rank=RANK[STAGING], share=2.0) is True


def test_only_unmoved_requests_of_one_class_can_reorder_as_they_age():
    reorders = queue_policy.reorders_with_age
    staging = _place(STAGING)
    assert reorders(staging, rank=RANK[STAGING], aged_at=NOW, moved=False) is True
    assert reorders(staging, rank=RANK[PROD], aged_at=NOW, moved=False) is False  # it is of a lower class
    assert reorders(staging, rank=RANK[DEV], aged_at=NOW, moved=False) is False  # it is of a higher class
    assert reorders(staging, rank=RANK[STAGING], aged_at=None, moved=False) is False  # nobody ages
    assert reorders(staging, rank=RANK[STAGING], aged_at=NOW, moved=True) is False
    assert reorders(_place(STAGING, manual_rank=1), rank=RANK[STAGING], aged_at=NOW, moved=False) is False


def test_an_arrival_ranks_ahead_by_class_or_by_a_lower_share_of_its_class_and_never_of_a_moved_request():
    def request(priority, project_id):
        return SimpleNamespace(effective_priority=priority, project_id=project_id)

    shares = {1: 1.0, 2: 3.0, 3: 3.0}
    waiting = request(STAGING, 2)
    arrival_ahead = queue_policy.arrival_ahead
    assert arrival_ahead(request(STAGING, 1), waiting, shares, moved=False) == (True, True)  # a lower share
    assert arrival_ahead(request(STAGING, 2), request(STAGING, 1), shares, moved=False) == (False, False)  # higher
    assert arrival_ahead(request(STAGING, 3), waiting, shares, moved=False) == (False, False)  # same: younger
    assert arrival_ahead(request(PROD, 2), waiting, shares, moved=False) == (True, False)  # a higher class
    assert arrival_ahead(request(DEV, 1), waiting, shares, moved=False) == (False, False)  # a lower class
    assert arrival_ahead(request(PROD, 1), waiting, shares, moved=True) == (False, False)  # it was moved

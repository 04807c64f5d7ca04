"""The queue: who waits, in which order, what operators may do to it, and when it approves by itself."""

import datetime as dt

import pytest
from django.utils import timezone

from pools import services
from pools.choices import QueueAction, RequestState
from pools.exceptions import DomainError, InsufficientCapacity
from pools.models import Allocation, AutoApprovalPolicy, ProjectQueueWeight, QueueEntry, QueueEvent
from scheduling import queue
from scheduling.policy import queue_policy

pytestmark = pytest.mark.django_db

FULL = {"isolation": "full", "product": "H100-80GB", "profile_name": ""}


@pytest.fixture
def full_request(make_request):
    def make(count=1, **fields):
        return make_request(count=count, wait_if_full=True, **{**FULL, **fields})

    return make


@pytest.fixture
def busy(fleet, full_request, operator):
    """Two whole GPUs, both held by one active request: anything else waits."""
    fleet.full_node("t1", gpus=2)
    holder = full_request(count=2)
    services.approve(holder, actor=operator)
    return holder


def waiting_order():
    return [p.entry.request_id for p in queue_policy.ordered()]


def test_a_request_that_chose_to_wait_is_queued_instead_of_refused(busy, full_request):
    request = full_request(count=1)
    queue.after_submit(request)
    request.refresh_from_db()
    assert request.state == RequestState.QUEUED
    entry = QueueEntry.objects.get(request=request)
    assert list(QueueEvent.objects.filter(request=request).values_list("action", flat=True)) == [QueueAction.QUEUED]
    assert request.transitions.last().to_state == RequestState.QUEUED
    assert entry.first_p50 is not None  # open-ended holder: the default hold time gives a date


def test_a_request_that_did_not_choose_to_wait_is_still_refused(busy, make_request, operator):
    request = make_request(count=1, **FULL)
    queue.after_submit(request)
    with pytest.raises(InsufficientCapacity):
        queue.approve_or_queue(request, actor=operator)
    request.refresh_from_db()
    assert request.state == RequestState.SUBMITTED
    assert not QueueEntry.objects.exists()


def test_an_operator_approval_short_of_capacity_queues_a_waiting_request(fleet, full_request, operator):
    fleet.full_node("t1", gpus=1)
    request = full_request(count=2)
    assert queue.approve_or_queue(request, actor=operator) is None
    request.refresh_from_db()
    assert request.state == RequestState.QUEUED


def test_an_operator_approval_that_queued_is_carried_out_when_capacity_frees(busy, full_request, operator):
    request = full_request(count=1)
    assert queue.approve_or_queue(request, actor=operator) is None
    entry = QueueEntry.objects.get(request=request)
    assert entry.operator_approved_by == operator and entry.operator_approved_at is not None
    assert not AutoApprovalPolicy.objects.exists()
    services.release(busy, actor=operator)
    assert queue.process().approved == [request.pk]
    request.refresh_from_db()
    assert request.state == RequestState.PROVISIONING
    assert (request.approved_by, request.approved_by_policy) == (operator, None)
    event = QueueEvent.objects.get(request=request, action=QueueAction.APPROVED)
    assert event.actor == operator
    assert event.detail.startswith("operator approved it at ")
    assert not QueueEvent.objects.filter(request=request, action=QueueAction.APPROVABLE).exists()


def test_a_queued_request_no_operator_approved_is_only_flagged(busy, full_request, operator):
    request = full_request(count=1)
    queue.after_submit(request)
    services.release(busy, actor=operator)
    assert queue.process().flagged == [request.pk]
    request.refresh_from_db()
    assert request.state == RequestState.QUEUED


def test_order_is_priority_class_then_fair_share_then_age(busy, full_request, project, other_project, bob):
    dev = full_request(workload_type="development")
    prod_busy_project = full_request(workload_type="inference")  # project holds 2 GPUs already
    prod_idle_project = full_request(workload_type="inference", target=other_project)
    prod_idle_later = full_request(workload_type="training", target=other_project)
    staging = full_request(priority_class="staging", workload_type="inference")
    for request in (dev, prod_busy_project, prod_idle_project, prod_idle_later, staging):
        queue.enqueue(request)
    assert waiting_order() == [prod_idle_project.pk, prod_idle_later.pk, prod_busy_project.pk, staging.pk, dev.pk]


def test_a_projects_weight_scales_its_fair_share(busy, full_request, project, other_project):
    Allocation.objects.filter(project=project).update(allocated_at=timezone.now() - dt.timedelta(hours=1))
    mine = full_request()
    theirs = full_request(target=other_project)
    for request in (mine, theirs):
        queue.enqueue(request)
    assert waiting_order() == [theirs.pk, mine.pk]  # 2 GPU-h vs 0
    assert queue_policy.fair_shares({project.pk, other_project.pk}) == {
        project.pk: pytest.approx(2.0, rel=0.01),
        other_project.pk: 0.0,
    }
    ProjectQueueWeight.objects.create(project=project, weight=4)
    assert queue_policy.fair_shares({project.pk})[project.pk] == pytest.approx(0.5, rel=0.01)


def test_a_request_waiting_past_the_aged_limit_is_served_by_age_not_fair_share(
    busy, full_request, project, other_project, settings
):
    settings.QUEUE_AGED_AFTER_H = 4
    Allocation.objects.filter(project=project).update(allocated_at=timezone.now() - dt.timedelta(hours=6))
    now = timezone.now()
    old_mine, young_mine, theirs = full_request(), full_request(), full_request(target=other_project)
    older_theirs = full_request(target=other_project)
    dev = full_request(target=other_project, workload_type="development")
    for request, waited_h in ((old_mine, 5), (young_mine, 1), (theirs, 0.5), (older_theirs, 4.5), (dev, 9)):
        queue.enqueue(request)
        QueueEntry.objects.filter(request=request).update(queued_at=now - dt.timedelta(hours=waited_h))
    # Aged first, oldest first (team-a's higher share no longer counts); then fair share; a lower class last.
    assert waiting_order() == [old_mine.pk, older_theirs.pk, theirs.pk, young_mine.pk, dev.pk]
    places = {p.entry.request_id: p.aged for p in queue_policy.ordered()}
    assert places == {old_mine.pk: True, older_theirs.pk: True, theirs.pk: False, young_mine.pk: False, dev.pk: True}

    settings.QUEUE_AGED_AFTER_H = 0  # fair share always orders
    assert waiting_order() == [older_theirs.pk, theirs.pk, old_mine.pk, young_mine.pk, dev.pk]


def test_move_puts_a_request_at_a_place_and_keeps_the_others_order(busy, full_request, operator):
    a, b, c = full_request(), full_request(), full_request()
    for request in (a, b, c):
        queue.enqueue(request)
    assert queue.move(c, position=1, actor=operator, reason="customer demo") == 1
    assert waiting_order() == [c.pk, a.pk, b.pk]
    assert queue.move(a, position=3, actor=operator) == 3
    assert waiting_order() == [c.pk, b.pk, a.pk]
    event = QueueEvent.objects.filter(request=c, action=QueueAction.MOVED).get()
    assert event.actor == operator and event.detail == "from 3 to 1. customer demo"


def test_hold_skips_a_request_and_release_of_the_hold_puts_it_back(busy, full_request, operator):
    first, second = full_request(), full_request()
    queue.enqueue(first)
    queue.enqueue(second)
    AutoApprovalPolicy.objects.create(name="all")
    queue.hold(first, actor=operator, reason="budget check")
    with pytest.raises(DomainError):
        queue.hold(first, actor=operator)
    services.release(busy, actor=operator)
    result = queue.process()
    assert result.approved == [second.pk]  # the held head keeps its place but is skipped
    first.refresh_from_db()
    assert first.state == RequestState.QUEUED
    queue.unhold(first, actor=operator)
    assert queue.process().approved == [first.pk]
    actions = list(QueueEvent.objects.filter(request=first).values_list("action", flat=True))
    assert actions == ["queued", "held", "unheld", "auto_approved"]


def test_cancel_needs_a_reason_and_rejects_the_request(busy, full_request, operator):
    request = full_request()
    queue.enqueue(request)
    with pytest.raises(DomainError):
        queue.cancel(request, actor=operator, reason=" ")
    queue.cancel(request, actor=operator, reason="project closed")
    request.refresh_from_db()
    assert request.state == RequestState.REJECTED
    assert request.state_reason == "cancelled from the queue: project closed"
    assert QueueEvent.objects.filter(request=request, action=QueueAction.CANCELLED, actor=operator).exists()
    with pytest.raises(DomainError):
        queue.hold(request, actor=operator)


def test_the_owner_may_withdraw_a_queued_request(busy, full_request, bob):
    request = full_request()
    queue.enqueue(request)
    services.withdraw(request, actor=bob)
    assert request.state == RequestState.WITHDRAWN
    assert queue_policy.ordered() == []


def test_freed_capacity_goes_to_the_head_by_policy_and_the_policy_is_recorded(busy, full_request, operator):
    policy = AutoApprovalPolicy.objects.create(name="small full GPUs", spec_kind="full", max_units=1)
    head, big = full_request(count=1), full_request(count=2)
    queue.enqueue(head)
    queue.enqueue(big)
    services.release(busy, actor=operator)
    result = queue.process()
    assert result.approved == [head.pk]
    assert result.blocked == [big.pk]  # one GPU left, it needs two
    head.refresh_from_db()
    assert head.state == RequestState.PROVISIONING
    assert head.approved_by_policy == policy and head.approved_by is None
    assert QueueEvent.objects.get(request=head, action=QueueAction.AUTO_APPROVED).policy == policy


def test_without_a_policy_the_head_is_flagged_once_and_blocks_its_spec(busy, full_request, operator):
    head, behind = full_request(count=2), full_request(count=1)
    queue.enqueue(head)
    queue.enqueue(behind)
    AutoApprovalPolicy.objects.create(name="singles", max_units=1)  # allows `behind`, not the head
    services.release(busy, actor=operator)
    assert queue.process().flagged == [head.pk]
    assert queue.process().flagged == [head.pk]
    entry = QueueEntry.objects.get(request=head)
    assert entry.approvable_at is not None
    assert QueueEvent.objects.filter(request=head, action=QueueAction.APPROVABLE).count() == 1
    behind.refresh_from_db()
    assert behind.state == RequestState.QUEUED  # the head's units are not given to the one behind
    queue.approve_or_queue(head, actor=operator)
    head.refresh_from_db()
    assert head.state == RequestState.PROVISIONING and head.approved_by == operator


def test_a_policy_approves_at_submission_when_capacity_is_there(fleet, full_request, project):
    fleet.full_node("t1", gpus=2)
    policy = AutoApprovalPolicy.objects.create(name="team", project_group="", max_units=2)
    policy.projects.add(project)
    request = full_request(count=2)
    queue.after_submit(request)
    request.refresh_from_db()
    assert request.state == RequestState.PROVISIONING and request.approved_by_policy == policy


@pytest.mark.parametrize(
    ("fields", "allowed"),
    [
        ({}, True),
        ({"max_units": 1}, False),
        ({"tier": "dev"}, False),
        ({"profile_name": "1g.10gb"}, False),
        ({"max_duration_h": 10}, False),  # open-ended never fits a maximum duration
        ({"project_group": "cc-ops"}, False),
        ({"window_start": dt.time(9), "window_end": dt.time(17)}, True),
        ({"window_start": dt.time(17), "window_end": dt.time(9)}, False),
        ({"window_start": dt.time(22), "window_end": dt.time(10)}, True),  # over midnight
    ],
)
def test_policy_conditions(make_request, fields, allowed):
    request = make_request(count=2)
    policy = AutoApprovalPolicy(name="p", **fields)
    at = dt.datetime(2026, 12, 3, 9, 30, tzinfo=dt.UTC)
    assert policy.allows(request, at, project_ids=set()) is allowed


def test_policy_duration_and_projects(make_request, project, other_project):
    start = timezone.now()
    request = make_request(count=1, start_at=start, end_at=start + dt.timedelta(hours=8))
    assert AutoApprovalPolicy(name="p", max_duration_h=8).allows(request, start, project_ids=set())
    assert not AutoApprovalPolicy(name="p", max_duration_h=7).allows(request, start, project_ids=set())
    assert not AutoApprovalPolicy(name="p").allows(request, start, project_ids={other_project.pk})
    project.cost_centre = "cc-ml"
    project.save()
    request.project.refresh_from_db()
    assert AutoApprovalPolicy(name="p", project_group="cc-ml").allows(request, start, project_ids={other_project.pk})

"""Every event of issue #31 item 2, triggered through the service that makes it happen, reaches each member
of the project exactly once by email and each of its webhooks exactly once (generic JSON and Slack-compatible),
signed."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.core import mail
from django.utils import timezone
from monitoring_helpers import T0, allocate, build_fleet, series_of

from billing.services import statements as billing_statements
from capacity.choices import Tier
from capacity.mig.catalog import get_product
from capacity.models import (
    Cluster,
    GpuCapacity,
    MigInstance,
    MigReconfiguration,
    NodeCapacity,
    NodeDrain,
    SpecAndCount,
)
from monitoring.services import trespass
from monitoring.services.idle import detect_idle
from monitoring.services.ingest import ingest_samples, sample_row
from notifications import services
from notifications.adapters import webhooks
from notifications.choices import DeliveryState, EventKind
from notifications.models import Delivery, Event
from operations.maintenance.steps import step_notify
from pools import lending
from pools import services as pool_services
from pools.choices import LoanState
from pools.models import Loan
from pools.signals import AllocationEndCause
from scheduling import queue

pytestmark = pytest.mark.django_db

FULL = {"isolation": "full", "product": "H100-80GB", "profile_name": ""}


def full_gpus(count: int) -> None:
    """A training node with `count` whole H100s."""
    catalog = get_product("H100-80GB")
    cluster = Cluster.objects.create(name="t", kubeconfig_path="/tmp/t.kubeconfig")
    node = NodeCapacity.objects.create(
        cluster=cluster, name="t1", gpu_product=catalog.gfd_product, tier=Tier.TRAINING, ready=True
    )
    for index in range(count):
        GpuCapacity.objects.create(
            node=node,
            index=index,
            uuid=f"GPU-T-{index}",
            product=catalog.model_name,
            catalog_product=catalog.key,
            memory_mib=catalog.memory_mib,
        )
    SpecAndCount.objects.create(
        node=node, kind="full", product="H100-80GB", resource_name="nvidia.com/gpu", count=count, allocatable=count
    )


def new_request(project, user, count=1, **fields):
    spec = pool_services.resolve_spec(**FULL)
    values = {
        "isolation": spec.isolation,
        "tier": spec.tier,
        "spec_kind": spec.spec_kind,
        "product": spec.product,
        "profile_name": spec.profile_name,
        "count": count,
        **fields,
    }
    return pool_services.create_request(project, actor=user, submit=True, **values)


# --- Triggers: each returns the key of the event it caused ------------------------------------------


def approved(team, operator):
    full_gpus(1)
    request = new_request(team["project"], team["users"][1])
    pool_services.approve(request, actor=operator)
    return f"request_approved:{request.pk}"


def queued(team, operator):
    full_gpus(1)
    request = new_request(team["project"], team["users"][1], count=2, wait_if_full=True)
    queue.after_submit(request)
    return f"request_queued:{request.pk}"


def started_from_queue(team, operator):
    full_gpus(1)
    holder = new_request(team["project"], team["users"][1])
    pool_services.approve(holder, actor=operator)
    request = new_request(team["project"], team["users"][1], wait_if_full=True)
    assert queue.approve_or_queue(request, actor=operator) is None
    pool_services.release(holder, actor=operator)
    assert queue.process().approved == [request.pk]
    return f"request_started_from_queue:{request.pk}"


def refused(team, operator):
    request = new_request(team["project"], team["users"][1])
    pool_services.reject(request, actor=operator, reason="no budget this quarter")
    return f"request_refused:{request.pk}"


def pool_expiring(team, operator):
    full_gpus(1)
    end = timezone.now() + dt.timedelta(hours=3)
    request = new_request(team["project"], team["users"][1], end_at=end)
    pool_services.approve(request, actor=operator)
    assert services.announce_expiring() == 1
    assert services.announce_expiring() == 0  # once
    return f"pool_expiring:{request.pk}:{int(end.timestamp())}"


def idle_flagged(team, operator, settings):
    settings.METRICS_INTERVAL_S = 300
    settings.MONITORING_IDLE_SM_PCT = 5
    settings.MONITORING_IDLE_WINDOW_H = 24
    settings.MONITORING_IDLE_MIN_COVERAGE_PCT = 50
    fleet = build_fleet()
    allocation = allocate(team["project"], fleet.mig_3g)
    now = T0 + dt.timedelta(days=1)
    sid = series_of(fleet.mig_gpu, fleet.mig_3g)
    ingest_samples([sample_row(sid, now - dt.timedelta(seconds=300 * (i + 1)), {"sm_active": 1.0}) for i in range(288)])
    assert detect_idle(now=now)["flagged"] == 1
    assert detect_idle(now=now)["flagged"] == 0
    return f"idle_flagged:{allocation.idle_flags.get().pk}"


def loan_reclaimed(team, operator, other_project):
    fleet = build_fleet()
    lent = allocate(other_project, fleet.mig_3g)
    loan = Loan.objects.create(allocation=lent, lender_pool=lent.pool, borrower=team["project"], state=LoanState.ACTIVE)
    assert lending.request_reclaim(loan, reason="the lender needs it")
    assert not lending.request_reclaim(loan, reason="again")
    return f"loan_reclaimed:{loan.pk}"


def ended_by_maintenance(team, operator):
    fleet = build_fleet()
    allocation = allocate(team["project"], fleet.mig_3g)
    MigInstance.objects.filter(pk=fleet.mig_3g.pk).update(state="gone")
    pool_services.rehome_allocations([fleet.mig_3g.pk], at=timezone.now())
    event = Event.objects.get(key=f"allocation_ended:{allocation.pk}")
    assert event.payload["cause"] == AllocationEndCause.MAINTENANCE
    return event.key


def ended_by_mig_change(team, operator):
    fleet = build_fleet()
    allocation = allocate(team["project"], fleet.mig_3g)
    MigInstance.objects.filter(pk=fleet.mig_3g.pk).update(state="gone")
    pool_services.rehome_allocations([fleet.mig_3g.pk], at=timezone.now(), cause=AllocationEndCause.MIG_CHANGE)
    event = Event.objects.get(key=f"allocation_ended:{allocation.pk}")
    assert event.payload["cause"] == AllocationEndCause.MIG_CHANGE
    return event.key


def statement_finalised(team, operator):
    statement = billing_statements.generate_statement(team["project"], dt.date(2026, 4, 1))
    billing_statements.finalise_statement(statement, actor=operator)
    return f"statement_finalised:{statement.pk}"


def trespassed(team, operator, other_project, monkeypatch):
    fleet = build_fleet()
    allocate(team["project"], fleet.mig_3g)
    finding = trespass.Finding(
        kind="foreign_pod",
        unit=(fleet.mig_gpu.pk, fleet.mig_3g.pk),
        owner_project_id=team["project"].pk,
        project_id=other_project.pk,
        namespace="team-b",
        pod_name="miner",
        pod_uid="uid-1",
    )
    monkeypatch.setattr(trespass, "find", lambda cluster, at: [finding])
    result = trespass.detect_trespass(fleet.cluster.pk)
    trespass.detect_trespass(fleet.cluster.pk)  # still there: kept open, not announced again
    return f"trespass:{result.opened[0]}"


def maintenance_notice(team, operator):
    fleet = build_fleet()
    allocate(team["project"], fleet.mig_3g)
    drain = NodeDrain.objects.create(cluster=fleet.cluster, node=fleet.node, reason="driver 570", grace_s=600)
    step_notify(drain, timezone.now())
    step_notify(drain, timezone.now())  # a redelivered step: recorded once
    return f"maintenance_notice:{drain.pk}:{team['project'].pk}"


TRIGGERS = {
    EventKind.REQUEST_APPROVED: approved,
    EventKind.REQUEST_QUEUED: queued,
    EventKind.REQUEST_STARTED_FROM_QUEUE: started_from_queue,
    EventKind.REQUEST_REFUSED: refused,
    EventKind.POOL_EXPIRING: pool_expiring,
    EventKind.IDLE_FLAGGED: idle_flagged,
    EventKind.LOAN_RECLAIMED: loan_reclaimed,
    "allocation_ended_maintenance": ended_by_maintenance,
    "allocation_ended_mig_change": ended_by_mig_change,
    EventKind.STATEMENT_FINALISED: statement_finalised,
    EventKind.TRESPASS: trespassed,
    EventKind.MAINTENANCE_NOTICE: maintenance_notice,
}


# What each subject says (after the project's slug), written at fan-out.
SUBJECTS = {
    EventKind.REQUEST_APPROVED: r"request #\d+ approved$",
    EventKind.REQUEST_QUEUED: r"request #\d+ queued: waiting for capacity$",
    EventKind.REQUEST_STARTED_FROM_QUEUE: r"request #\d+ started from the queue$",
    EventKind.REQUEST_REFUSED: r"request #\d+ refused$",
    EventKind.POOL_EXPIRING: r"pool of request #\d+ ends \d{4}-\d\d-\d\d \d\d:\d\d UTC$",
    EventKind.IDLE_FLAGGED: r"allocation #\d+ flagged idle$",
    EventKind.LOAN_RECLAIMED: r"a borrowed unit is being reclaimed \(loan #\d+\)$",
    "allocation_ended_maintenance": r"allocation #\d+ ended by maintenance$",
    "allocation_ended_mig_change": r"allocation #\d+ ended by a MIG change$",
    EventKind.STATEMENT_FINALISED: r"statement for 2026-04 finalised$",
    EventKind.TRESPASS: r"pod team-b/miner is using your unit mig:\d+$",
    EventKind.MAINTENANCE_NOTICE: r"maintenance on \S+: your reservations move$",
}


def test_every_project_event_of_the_issue_has_a_trigger_here():
    covered = {str(k) for k in TRIGGERS} | {EventKind.ALLOCATION_ENDED}
    assert {str(k) for k in EventKind if k != EventKind.OPERATOR_DIGEST} <= covered


@pytest.mark.parametrize("name", list(TRIGGERS))
def test_each_event_reaches_each_member_once_by_email_and_each_webhook_once(
    name, team, operator, other_project, receiver, sent, settings, monkeypatch
):
    trigger = TRIGGERS[name]
    extra = {"settings": settings, "other_project": other_project, "monkeypatch": monkeypatch}
    names = trigger.__code__.co_varnames[: trigger.__code__.co_argcount]
    key = sent(lambda: trigger(team, operator, **{k: v for k, v in extra.items() if k in names}))

    event = Event.objects.get(key=key)
    assert event.project == team["project"]
    assert re.match(r"team-a: " + SUBJECTS[name], event.subject), event.subject
    assert event.body.endswith("/projects/team-a/")
    deliveries = Delivery.objects.filter(event=event)
    assert sorted((d.channel, d.address, d.state, d.attempts) for d in deliveries) == sorted(
        [
            ("email", "alice@example.com", DeliveryState.SENT, 1),
            ("email", "bob@example.com", DeliveryState.SENT, 1),
            ("webhook", team["json"].url, DeliveryState.SENT, 1),
            ("webhook", team["slack"].url, DeliveryState.SENT, 1),
        ]
    )
    mine = [m for m in mail.outbox if m.subject == f"[gpuaas] {event.subject}"]
    assert sorted(m.to[0] for m in mine) == ["alice@example.com", "bob@example.com"]
    assert all(len(m.to) == 1 and event.body in m.body for m in mine)

    posts = [r for r in receiver.at("/json") if r.json()["id"] == key]
    assert len(posts) == 1
    body = posts[0].json()
    assert (body["kind"], body["project"], body["subject"]) == (event.kind, "team-a", event.subject)
    headers = posts[0].headers
    assert headers[webhooks.EVENT_HEADER] == event.kind
    assert webhooks.verify(
        team["json"].secret, headers[webhooks.TIMESTAMP_HEADER], posts[0].body, headers[webhooks.SIGNATURE_HEADER]
    )
    assert not webhooks.verify("another secret", headers[webhooks.TIMESTAMP_HEADER], posts[0].body,
                               headers[webhooks.SIGNATURE_HEADER])  # fmt: skip

    slack = [r for r in receiver.at("/slack") if event.subject in r.json().get("text", "")]
    assert len(slack) == 1
    assert set(slack[0].json()) == {"text"}
    assert webhooks.verify(
        team["slack"].secret,
        slack[0].headers[webhooks.TIMESTAMP_HEADER],
        slack[0].body,
        slack[0].headers[webhooks.SIGNATURE_HEADER],
    )


def test_an_instance_gone_while_its_node_is_reconfigured_ends_by_mig_change(team, sent):
    """Rediscovery during a reconfiguration (capacity's instances-gone hook) names the MIG change, not maintenance."""
    fleet = build_fleet()
    allocation = allocate(team["project"], fleet.mig_3g)
    MigReconfiguration.objects.create(cluster=fleet.cluster, node=fleet.node, target={"0": ["7g.80gb"]})
    MigInstance.objects.filter(pk=fleet.mig_3g.pk).update(state="gone")
    sent(lambda: pool_services.rehome_allocations([fleet.mig_3g.pk], at=timezone.now()))
    event = Event.objects.get(key=f"allocation_ended:{allocation.pk}")
    assert event.payload["cause"] == AllocationEndCause.MIG_CHANGE
    assert Delivery.objects.filter(event=event, state=DeliveryState.SENT).count() == 4

"""`python manage.py bench queue --gpus 512 --days 30 --seed 1`: a month of demand through the queue.

A synthetic month (generated from --seed) of pool requests for whole H100 GPUs, from 20 projects,
is replayed through the real services (pools.services approve/release, pools.queue after_submit and
process, pools.forecast, and for borrowing monitoring.services.lending.lend_idle and pools.lending
reconcile_loans/end_loan with the real Loan state machine) on the configured database, in a throwaway
copy per policy, under a simulated clock (django.utils.timezone.now is patched to the replay's time):

- refuse: today's behaviour, a request that does not fit is refused;
- queue: requests wait (`wait_if_full`); one auto-approval policy ("every request") approves the
  queue's head whenever units come free, and the queue is passed over again when a waiting request
  ages (QUEUE_AGED_AFTER_H after it was queued), as the queue's beat would;
- queue+borrowing: as queue, every pool opts in to lending (it is off by default), and idle pools lend their
  units to the queue (docs/queue.md, Borrowing).
  An idle pool (IDLE_SHARE of pools, 2% SM) is flagged by the idle detector MONITORING_IDLE_WINDOW_H
  after it starts (the flag is written as the detector would write it; the metrics behind it are
  not replayed). lend_idle() runs every LENDING_INTERVAL_S and lends flagged units to waiting
  requests of other projects. A borrower **starts when lent units cover its whole count**: its wait
  ends then (that is its start for mean_wait_h and p90_wait_h), its work runs down while it holds
  them, and it moves to its own units, with what is left of its hold, when the queue approves it (the
  product ends its loans then, in the approval's transaction: pools.services.transition); a borrower
  whose work is done on lent units gives them back and withdraws its request. An idle pool's need
  comes back at a modelled time (need_back_h): from then on its namespace has a Pending pod for the
  lent resource, which reconcile_loans(), stepped on the simulated clock every
  LENDING_RECONCILE_INTERVAL_S, sees; it requests the reclaim, and ends the loan
  LENDING_RECLAIM_GRACE_S later; the borrower then waits again for its remaining work.
  Reconcile ticks at which no loan can change (no need pending, no grace running out, no lender
  released) are skipped: they would be no-ops.

The mix (per workload type: share of arrivals, sizes, median hold, share with a declared end, SM
activity) is in MIX; arrivals follow a daily cycle whose mean offers OFFERED_LOAD of the fleet.
Kubernetes is left out (provisioning, clean-up, the borrower's quota reconcile and the Eviction API
calls are not made; the lender's Pending pod is served to reconcile_loans() by a stand-in client):
the benchmark measures the decisions, not the cluster. Notifications are recorded as events, but not
fanned out to the broker. Placement of a borrower on lent units of
several nodes is not checked (a multi-GPU borrower may hold units of different nodes).

Reported per policy: mean_wait_h and p90_wait_h (arrival to start, over requests that started;
requests still waiting at the end count with their wait so far), reserved_utilisation (SM-active
GPU-hours over reserved GPU-hours, from each request's synthetic SM activity; an idle pool is busy
again from its need_back_h in every policy; borrowed hours add SM-active hours on the lender's
reserved units), refused, ended_waiting (their end date came while they waited),
lender_reclaim_p99_s (p99 over reclaimed loans of Loan.returned_at minus the modelled moment the
lender's need came back; null without borrowing), and for queued policies forecast_mae_ratio
(pools.forecast.accuracy(): mean |first P50 - actual start| over the mean actual wait, for requests
approved out of the queue).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import heapq
import math
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from unittest import mock

from django.conf import settings
from django.core.management.base import CommandError
from django.db import connection
from django.db.models import Count

from capacity.adapters.kubernetes.objects import Pod
from capacity.choices import Tier
from capacity.models import Cluster
from monitoring.choices import IdleProposal, IdleState
from monitoring.models import IdleReservation
from monitoring.services.lending import lend_idle
from pools import forecast, lending, queue, queue_order, services
from pools.choices import LoanState, RequestState
from pools.exceptions import InsufficientCapacity
from pools.models import Allocation, AutoApprovalPolicy, GpuPool, Loan, PoolRequest, QueueEntry
from tenancy.models import Project

from ..pools import _percentile, bench_database, double_allocated, h100_fleet
from ..registry import Smoke, arg, benchmark
from ..targets import correctness, performance

# workload type: (share of arrivals, sizes (GPUs), median hold h, sigma of log hold, share with an end date,
#                 SM activity range)
MIX = {
    "inference": (0.35, (1, 2, 4), 48.0, 0.8, 0.7, (0.4, 0.8)),
    "training": (0.25, (4, 8), 24.0, 0.8, 0.4, (0.7, 0.95)),
    "staging": (0.20, (1, 2), 12.0, 0.7, 0.5, (0.1, 0.4)),
    "development": (0.20, (1,), 6.0, 0.7, 0.8, (0.05, 0.3)),
}
IDLE_SHARE = 0.15  # of pools that sit idle (2% SM activity), as the idle detector finds in the demo
IDLE_ACTIVITY = 0.02
# An idle pool's need comes back after this share of its hold (uniform); at or past 1, never before release.
NEED_BACK = (0.3, 1.5)
OFFERED_LOAD = 0.95  # mean GPU-hours asked per hour, over the fleet's GPUs
PROJECTS = 20
START = dt.datetime(2026, 11, 2, tzinfo=dt.UTC)
# Planner statistics are refreshed this often (simulated hours) on PostgreSQL, as autovacuum would in production.
ANALYZE_EVERY_H = 6
POLICIES = ("refuse", "queue", "queue+borrowing")
BOUNDS_DRAWS = 50  # draws per forecast for --forecast-bounds' partly known futures


@dataclass(frozen=True)
class Arrival:
    at: dt.datetime
    project: int
    workload: str
    size: int
    hold_h: float
    declared: bool
    activity: float
    need_back_h: float | None = None  # idle pools: hours after its start when the lender needs its units again
    busy_activity: float = 0.0  # idle pools: SM activity once the need is back


def generate(*, gpus: int, days: int, seed: int) -> list[Arrival]:
    """A month of arrivals: a Poisson process with a daily cycle, sized to offer OFFERED_LOAD of the fleet.

    The idle pools' need-back times come from a second generator, so the arrivals are the same as
    before borrowing was modelled.
    """
    rng = random.Random(seed)
    lender_rng = random.Random(f"{seed}-lenders")
    kinds = list(MIX)
    weights = [MIX[k][0] for k in kinds]
    mean_gpu_h = sum(
        MIX[k][0] * (sum(MIX[k][1]) / len(MIX[k][1])) * MIX[k][2] * math.exp(MIX[k][3] ** 2 / 2) for k in kinds
    )
    rate = OFFERED_LOAD * gpus / mean_gpu_h  # arrivals per hour
    arrivals, t = [], 0.0
    while True:
        t += rng.expovariate(rate * 1.5)  # thinning: accept by the daily cycle (mean 2/3 of the peak)
        if t >= days * 24:
            return arrivals
        if rng.random() > (1 + 0.5 * math.sin(2 * math.pi * (t % 24 - 6) / 24)) / 1.5:
            continue
        kind = rng.choices(kinds, weights)[0]
        _, sizes, median, sigma, declared, activity = MIX[kind]
        idle = rng.random() < IDLE_SHARE
        project, size = rng.randrange(PROJECTS), rng.choice(sizes)  # the draws in their original order
        hold_h = max(0.25, rng.lognormvariate(math.log(median), sigma))
        has_end = rng.random() < declared
        need_back_h, busy = None, 0.0
        if idle:
            share, busy = lender_rng.uniform(*NEED_BACK), lender_rng.uniform(*activity)
            need_back_h = hold_h * share if share < 1 else None
        arrivals.append(
            Arrival(
                at=START + dt.timedelta(hours=t),
                project=project,
                workload=kind,
                size=size,
                hold_h=hold_h,
                declared=has_end,
                activity=IDLE_ACTIVITY if idle else rng.uniform(*activity),
                need_back_h=need_back_h,
                busy_activity=busy,
            )
        )


class Clock:
    def __init__(self):
        self.now = START

    def __call__(self) -> dt.datetime:
        return self.now


def _hours(a: dt.datetime, b: dt.datetime) -> float:
    return max(0.0, (b - a).total_seconds() / 3600)


def _grid(at: dt.datetime, period_s: int) -> dt.datetime:
    """The first beat tick at or after `at`, on a grid of `period_s` from START."""
    elapsed = (at - START).total_seconds()
    return START + dt.timedelta(seconds=math.ceil(elapsed / period_s) * period_s)


class _LenderPods:
    """Stands in for the Kubernetes client reconcile_loans() reads: a Pending pod for the lent resource
    in each namespace whose lender needs its units back; no pods to evict (evictions are not replayed)."""

    def __init__(self):
        self.pending: set[str] = set()

    def __call__(self, cluster):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def list_pods(self, namespace: str = "", **_) -> list[Pod]:
        if namespace not in self.pending:
            return []
        return [Pod(namespace, "lender", "", "", "Pending", {}, {}, {"nvidia.com/gpu": 1}, None, False)]

    def list_pods_on_node(self, node_name: str, namespace: str = "", **_) -> list[Pod]:
        return []

    def evict_pod(self, namespace: str, name: str, **_) -> None:  # pragma: no cover - never called: no pods
        raise AssertionError("no borrower pods exist in the replay")


def unsynced_commits() -> None:
    """Commit without waiting for the disk, on this connection to the throwaway database (nothing in it has to
    survive a crash): a replay commits thousands of transactions, one per event or more, and on this shared
    machine each fsync took ~20 ms (a seventh of a replay's time in a profile). What is committed, and when, is
    unchanged. Inside a transaction (a test's) nothing is committed: left as it is (SQLite refuses the change)."""
    if connection.in_atomic_block:
        return
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA synchronous = OFF")
        elif connection.vendor == "postgresql":
            cursor.execute("SET synchronous_commit TO OFF")


class Replay:
    """One policy's run over the arrivals; run() returns its figures."""

    def __init__(self, arrivals: list[Arrival], *, gpus: int, days: int, policy: str, bounds: bool = False):
        self.arrivals, self.gpus, self.policy = arrivals, gpus, policy
        self.bounds = bounds and policy != "refuse"
        self.plans: dict[int, forecast.Plan] = {}  # queued request id: what its first forecast drew from
        self.queued = policy != "refuse"
        self.borrowing = policy == "queue+borrowing"
        self.end = START + dt.timedelta(days=days)
        self.clock = Clock()
        self.events: list[tuple[dt.datetime, int, str, int]] = []
        self.seq = 0
        self.by_request: dict[int, Arrival] = {}
        self.arrived_at: dict[int, dt.datetime] = {}
        self.started: dict[int, dt.datetime] = {}  # first start: own units, or lent units covering the count
        self.started_borrowing: set[int] = set()  # requests whose first start was on lent units
        self.own: dict[int, tuple[dt.datetime, dt.datetime]] = {}  # own pool: approved, planned release
        self.remaining_h: dict[int, float] = {}  # borrowers: work left
        self.running_since: dict[int, dt.datetime] = {}  # borrowers running on lent units now
        self.version: dict[int, int] = defaultdict(int)
        self.borrowed_active_h = 0.0
        self.need_at: dict[int, dt.datetime] = {}  # lender pool id: when its need came back
        self.pool_of: dict[int, int] = {}  # request id: pool id
        self.lender_pods = _LenderPods()
        self.ticks: set[dt.datetime] = set()
        self.refused = 0
        self.cluster = None

    # --- events --------------------------------------------------------------------------------

    def push(self, at: dt.datetime, kind: str, ref: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, ref))

    def tick_at(self, at: dt.datetime) -> None:
        """A reconcile_loans beat at the first grid tick at or after `at` (once per tick)."""
        at = _grid(at, settings.LENDING_RECONCILE_INTERVAL_S)
        if at not in self.ticks:
            self.ticks.add(at)
            self.push(at, "reconcile", 0)

    def start_own(self, pk: int, at: dt.datetime) -> None:
        """The request's own pool was approved at `at`: schedule its release after the work left."""
        arrival = self.by_request[pk]
        self.stop_borrowing(pk, at)
        work = self.remaining_h.pop(pk, arrival.hold_h)
        release_at = at + dt.timedelta(hours=work)
        if arrival.declared:
            release_at = min(release_at, self.arrived_at[pk] + dt.timedelta(hours=arrival.hold_h))
        release_at = max(release_at, at)
        self.started.setdefault(pk, at)
        self.own[pk] = (at, release_at)
        self.push(release_at, "release", pk)
        if self.borrowing:  # its loans ended with the approval (pools.services.transition)
            pool_id = GpuPool.objects.filter(request_id=pk).values_list("pk", flat=True).first()
            self.pool_of[pk] = pool_id
            # Lending is opt-in per pool (#25); this policy models every project opting in.
            GpuPool.objects.filter(pk=pool_id).update(lending_enabled=True)
            if arrival.activity == IDLE_ACTIVITY:
                self.push(at + dt.timedelta(hours=settings.MONITORING_IDLE_WINDOW_H), "flag", pk)
            if arrival.need_back_h is not None:
                self.push(at + dt.timedelta(hours=arrival.need_back_h), "need", pk)

    def note_approvals(self, ids, at: dt.datetime) -> None:
        for pk in ids:
            self.start_own(pk, at)

    def process(self, at: dt.datetime) -> None:
        result = queue.process(now=at)
        self.note_approvals(result.approved, at)
        for pk in result.ended:  # its loans ended with the rejection (pools.services.transition)
            self.stop_borrowing(pk, at)
            self.remaining_h.pop(pk, None)

    # --- borrowing -------------------------------------------------------------------------------

    def stop_borrowing(self, pk: int, at: dt.datetime) -> None:
        since = self.running_since.pop(pk, None)
        if since is None:
            return
        arrival = self.by_request[pk]
        ran = _hours(since, at)
        self.remaining_h[pk] = max(0.0, self.remaining_h.get(pk, arrival.hold_h) - ran)
        self.borrowed_active_h += ran * arrival.size * arrival.activity
        self.version[pk] += 1

    def sync_borrowers(self, at: dt.datetime) -> None:
        """Borrowers whose lent units (lent or in their grace period) cover their count run; others stop."""
        held = dict(
            Loan.objects.open()
            .filter(borrower_request__state=RequestState.QUEUED)
            .values_list("borrower_request")
            .annotate(n=Count("pk"))
            .values_list("borrower_request", "n")
        )
        for pk in set(held) | set(self.running_since):
            arrival = self.by_request[pk]
            runs = held.get(pk, 0) >= arrival.size
            if runs and pk not in self.running_since:
                self.running_since[pk] = at
                if pk not in self.started:
                    self.started[pk] = at
                    self.started_borrowing.add(pk)
                left = self.remaining_h.setdefault(pk, arrival.hold_h)
                self.version[pk] += 1
                self.push(at + dt.timedelta(hours=left), f"done:{self.version[pk]}", pk)
            elif not runs and pk in self.running_since:
                self.stop_borrowing(pk, at)

    def borrower_done(self, pk: int, at: dt.datetime) -> None:
        """The borrower's work finished on lent units: it gives them back and withdraws its request."""
        self.stop_borrowing(pk, at)
        self.remaining_h[pk] = 0.0
        for loan in Loan.objects.open().filter(borrower_request_id=pk):
            lending.end_loan(loan, reason="the borrower's work is done", at=at)
        request = PoolRequest.objects.get(pk=pk)
        if request.state == RequestState.QUEUED:
            services.withdraw(request, actor=None, reason="done on borrowed units")
            self.process(at)  # it may have blocked requests of its spec behind it

    def flag_idle(self, pk: int, at: dt.datetime) -> None:
        """The idle detector's flag on each unit of an idle pool still held and not busy again."""
        pool_id = self.pool_of.get(pk)
        if pool_id is None or pool_id in self.need_at:
            return
        units = Allocation.objects.active().filter(pool_id=pool_id)
        window = dt.timedelta(hours=settings.MONITORING_IDLE_WINDOW_H)
        IdleReservation.objects.bulk_create(
            IdleReservation(
                allocation=unit,
                window_start=at - window,
                window_end=at,
                sm_active_avg=IDLE_ACTIVITY * 100,
                coverage=1.0,
                proposal=IdleProposal.RELEASE,
                detected_at=at,
                updated_at=at,
            )
            for unit in units
        )

    def need_back(self, pk: int, at: dt.datetime) -> None:
        """The lender is busy again: its flags clear, and its namespace has a Pending pod while it has units lent."""
        pool_id = self.pool_of.get(pk)
        if pool_id is None or not GpuPool.objects.filter(pk=pool_id, released_at__isnull=True).exists():
            return
        self.need_at[pool_id] = at
        IdleReservation.objects.open().filter(allocation__pool_id=pool_id).update(
            state=IdleState.CLEARED, closed_at=at, updated_at=at
        )
        if Loan.objects.open().filter(lender_pool_id=pool_id).exists():
            self.tick_at(at)

    def reconcile(self, at: dt.datetime) -> None:
        needing = Loan.objects.open().filter(lender_pool_id__in=list(self.need_at))
        self.lender_pods.pending = set(needing.values_list("lender_pool__project__namespace", flat=True))
        lending.reconcile_loans(self.cluster, now=at, client_factory=self.lender_pods)
        self.sync_borrowers(at)
        grace = dt.timedelta(seconds=settings.LENDING_RECLAIM_GRACE_S)
        for requested in Loan.objects.filter(state=LoanState.RECLAIMING).values_list("reclaim_requested_at", flat=True):
            self.tick_at(requested + grace)

    def analyze(self, at: dt.datetime) -> None:
        """Refresh the planner's statistics, as autovacuum does in production. The throwaway database starts
        empty and this server runs without autovacuum: never analysed, the planner takes the tables for
        empty and checks each GPU against every active allocation (an anti-join rescanned per GPU), which
        made each free-unit query cost ~200 ms at 512 GPUs. Plans change, answers do not (every query
        approval and the queue rely on is ordered)."""
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        self.push(at + dt.timedelta(hours=ANALYZE_EVERY_H), "analyze", 0)

    def lend(self, at: dt.datetime) -> None:
        if lend_idle(now=at):
            self.sync_borrowers(at)
        if at + dt.timedelta(seconds=settings.LENDING_INTERVAL_S) < self.end:
            self.push(at + dt.timedelta(seconds=settings.LENDING_INTERVAL_S), "lend", 0)

    # --- the run ---------------------------------------------------------------------------------

    def arrive(self, index: int, at: dt.datetime) -> None:
        arrival = self.arrivals[index]
        request = services.create_request(
            self.projects[arrival.project],
            actor=None,
            submit=True,
            workload_type=arrival.workload,
            isolation="full",
            spec_kind="full",
            product="H100-80GB",
            count=arrival.size,
            start_at=at,
            end_at=at + dt.timedelta(hours=arrival.hold_h) if arrival.declared else None,
            wait_if_full=self.queued,
        )
        self.by_request[request.pk] = arrival
        self.arrived_at[request.pk] = at
        if not self.queued:
            try:
                services.approve(request, actor=None)
                self.start_own(request.pk, at)
            except InsufficientCapacity:
                services.reject(request, actor=None, reason="refused: capacity short")
                self.refused += 1
            return
        queue.after_submit(request)
        if request.state != RequestState.QUEUED:
            self.start_own(request.pk, at)
            return
        aged = queue_order.aged_at(at)
        if aged is not None:  # the queue's beat (QUEUE_PROCESS_INTERVAL_S) passes over the new order then
            self.push(aged, "aged", request.pk)
        if self.bounds:  # read again what the first forecast (just stored by enqueue) drew from
            self.plans[request.pk] = forecast.plan(request, now=at)

    def release(self, pk: int, at: dt.datetime) -> None:
        services.release(PoolRequest.objects.get(pk=pk), actor=None)
        if self.borrowing and Loan.objects.open().filter(lender_pool_id=self.pool_of.get(pk)).exists():
            self.tick_at(at)  # the lender's release ends its loans at the next reconcile
        if self.queued:
            self.process(at)

    def run(self) -> dict:
        unsynced_commits()
        self.cluster = Cluster.objects.create(name="bench", kubeconfig_path="/dev/null")
        h100_fleet(self.cluster, self.gpus, node={"tier": Tier.TRAINING})
        self.projects = Project.objects.bulk_create(
            Project(name=f"P{i}", slug=f"p{i}", namespace=f"p{i}") for i in range(PROJECTS)
        )
        if self.queued:
            AutoApprovalPolicy.objects.create(name="every request")
        for i, a in enumerate(self.arrivals):
            self.push(a.at, "arrive", i)
        if self.borrowing:
            self.push(START, "lend", 0)
        if connection.vendor == "postgresql":
            self.push(START, "analyze", 0)
        with (
            mock.patch("django.utils.timezone.now", self.clock),
            mock.patch.object(services, "enqueue_provisioning"),
            mock.patch.object(services, "enqueue_deprovisioning"),
            mock.patch.object(services, "enqueue_queue_processing"),
            mock.patch("pools.tasks.reconcile_project_task.delay_on_commit"),
            mock.patch("pools.tasks.evict_returned_loans_task.delay_on_commit"),  # no borrower pods are replayed
            mock.patch.object(lending, "reconcile"),  # the borrower's quota in Kubernetes
            # The events are written; their delivery (a message to the broker per event) is not replayed.
            mock.patch("notifications.tasks.fan_out_task.delay_on_commit"),
        ):
            while self.events and self.events[0][0] < self.end:
                at, _, kind, ref = heapq.heappop(self.events)
                self.clock.now = at
                if kind == "arrive":
                    self.arrive(ref, at)
                elif kind == "release":
                    self.release(ref, at)
                elif kind == "reconcile":
                    self.reconcile(at)
                elif kind == "lend":
                    self.lend(at)
                elif kind == "flag":
                    self.flag_idle(ref, at)
                elif kind == "need":
                    self.need_back(ref, at)
                elif kind == "analyze":
                    self.analyze(at)
                elif kind == "aged":
                    if PoolRequest.objects.filter(pk=ref, state=RequestState.QUEUED).exists():
                        self.process(at)
                elif kind == f"done:{self.version[ref]}" and ref in self.running_since:
                    self.borrower_done(ref, at)
            self.clock.now = self.end
            for pk in list(self.running_since):
                self.stop_borrowing(pk, self.end)
            return self.figures()

    def figures(self) -> dict:
        end = self.end
        waits = [_hours(self.arrived_at[pk], at) for pk, at in self.started.items()]
        still = [
            pk
            for pk in PoolRequest.objects.filter(state=RequestState.QUEUED).values_list("pk", flat=True)
            if pk not in self.started
        ]
        waits += [_hours(self.arrived_at[pk], end) for pk in still]
        reserved = active = 0.0
        for pk, (at, release_at) in self.own.items():
            arrival = self.by_request[pk]
            until = min(release_at, end)
            hours = _hours(at, until) * arrival.size
            reserved += hours
            if arrival.need_back_h is not None:
                need = at + dt.timedelta(hours=arrival.need_back_h)
                active += arrival.size * (
                    _hours(at, min(need, until)) * arrival.activity + _hours(need, until) * arrival.busy_activity
                )
            else:
                active += hours * arrival.activity
        active += self.borrowed_active_h
        ended_waiting = PoolRequest.objects.filter(state=RequestState.REJECTED, state_reason__contains="while waiting")
        result = {
            "arrivals": len(self.arrivals),
            "started": len(self.started),
            "still_waiting": len(still),
            "mean_wait_h": round(sum(waits) / len(waits), 3) if waits else 0.0,
            "p90_wait_h": round(_percentile(waits, 0.9), 3),
            "reserved_utilisation": round(active / reserved, 3) if reserved else None,
            "refused": self.refused,
            "ended_waiting": ended_waiting.count(),
            "double_allocated": double_allocated(),
            "lender_reclaim_p99_s": None,
        }
        if self.borrowing:
            result.update(self.loan_figures())
        if self.queued:
            score = forecast.accuracy()
            result["forecast_mae_ratio"] = score["mae_ratio"]
            result["forecast"] = score
        if self.bounds:
            result["forecast_bounds"] = self.forecast_bounds()
        return result

    def forecast_bounds(self) -> dict:
        """The forecast's error if it had known part of the future: each scored request's first forecast drawn
        again with the holders' real releases (exact_holds), with the arrivals that did come and their real
        holds (exact_arrivals), and with both (exact_both: what is left is the draw's model of the queue
        itself). as_drawn re-draws the plan unchanged: it must equal forecast_mae_ratio. BOUNDS_DRAWS draws
        per forecast (exact_both is one: nothing is left to chance)."""
        started = dict(
            QueueEntry.objects.started()
            .filter(request_id__in=list(self.plans))
            .values_list("request_id", "request__approved_at")
        )
        request_of_pool = dict(GpuPool.objects.values_list("pk", "request_id"))
        approved = dict(PoolRequest.objects.values_list("pk", "approved_at"))
        pk_of = {id(arrival): pk for pk, arrival in self.by_request.items()}
        order = sorted((a.at, pk_of[id(a)]) for a in self.arrivals if id(a) in pk_of)
        variants = {
            "as_drawn": (False, False),
            "exact_holds": (True, False),
            "exact_arrivals": (False, True),
            "exact_both": (True, True),
        }
        errors: dict[str, list[float]] = {name: [] for name in variants}
        inside: dict[str, int] = dict.fromkeys(variants, 0)
        waits = []
        for pk, actual in sorted(started.items()):
            planned = self.plans[pk]
            waits.append(_hours(self.arrived_at[pk], actual))
            for name, (holds, arrivals) in variants.items():
                timeline = planned.timeline
                if timeline is not None and holds:
                    timeline = self._known_holds(timeline, request_of_pool)
                if timeline is not None and arrivals:
                    timeline = self._known_arrivals(timeline, order, approved, actual)
                n = 1 if name == "exact_both" else (None if name == "as_drawn" else BOUNDS_DRAWS)
                estimate = forecast.quantiles(planned, timeline, n=n)
                p50 = estimate.p50 or timeline.horizon  # never within the horizon: scored at the horizon
                errors[name].append(abs((actual - p50).total_seconds()) / 3600)
                inside[name] += estimate.p90 is not None and actual <= estimate.p90
        mean_wait = sum(waits) / len(waits) if waits else 0.0
        return {
            "scored": len(waits),
            "draws": BOUNDS_DRAWS,
            **{
                name: {
                    "mae_ratio": round(sum(e) / len(e) / mean_wait, 3) if mean_wait else None,
                    "within_p90": round(inside[name] / len(e), 3) if e else None,
                }
                for name, e in errors.items()
            },
        }

    def _known_holds(self, timeline: forecast.Timeline, request_of_pool: dict) -> forecast.Timeline:
        """The timeline with each holder's real release (its end date) and each request ahead's real hold."""
        holders = []
        for holder in timeline.holders:
            own = self.own.get(request_of_pool.get(holder.pool_id))
            holders.append(dataclasses.replace(holder, end_at=own[1]) if own else holder)
        ahead = [dataclasses.replace(w, hold_h=self.by_request[w.request_id].hold_h) for w in timeline.ahead]
        return dataclasses.replace(timeline, holders=holders, ahead=ahead)

    def _known_arrivals(self, timeline: forecast.Timeline, order: list, approved: dict, actual) -> forecast.Timeline:
        """The timeline with the requests that did arrive after it (to its horizon), their sizes and holds; one
        ranks ahead when the queue approved it before this request."""
        times, samples = [], []
        for at, pk in order:
            if timeline.now < at <= timeline.horizon:
                arrival, when = self.by_request[pk], approved.get(pk)
                times.append(at)
                samples.append(
                    forecast.Arrival(
                        arrival.size,
                        None,
                        arrival.workload,
                        ahead=when is not None and when < actual,
                        auto=True,
                        hold_h=arrival.hold_h,
                    )
                )
        return dataclasses.replace(timeline, coming=forecast.KnownArrivals(times, samples))

    def loan_figures(self) -> dict:
        loans = Loan.objects.all()
        back = [
            (returned - self.need_at[pool_id]).total_seconds()
            for pool_id, returned in loans.filter(
                lender_pool_id__in=list(self.need_at), returned_at__isnull=False, reclaim_requested_at__isnull=False
            ).values_list("lender_pool_id", "returned_at")
        ]
        return {
            "lender_reclaim_p99_s": round(_percentile(back, 0.99), 1) if back else None,
            "loans": loans.count(),
            "loans_reclaimed": len(back),
            "started_on_borrowed_units": len(self.started_borrowing),
            "borrowed_active_gpu_h": round(self.borrowed_active_h, 1),
            "reclaim_bound_s": settings.LENDING_RECLAIM_GRACE_S + settings.LENDING_RECONCILE_INTERVAL_S,
        }


def replay(arrivals: list[Arrival], *, gpus: int, days: int, policy: str, bounds: bool = False) -> dict:
    """Replay `arrivals` under `policy` (one of POLICIES) in the current database; the figures."""
    return Replay(arrivals, gpus=gpus, days=days, policy=policy, bounds=bounds).run()


def _ran(*policies: str):
    return lambda result: all(p in result.get("policies", {}) for p in policies)


def _reclaimed(result: dict) -> bool:
    return bool(result.get("policies", {}).get("queue+borrowing", {}).get("loans_reclaimed"))


B, Q, R = "policies.queue+borrowing", "policies.queue", "policies.refuse"


@benchmark(
    "queue",
    help="A synthetic month of requests under refuse-when-full, queue, queue+borrowing; waits, use, forecast error.",
    arguments=[
        arg("--gpus", type=int, default=512),
        arg("--days", type=int, default=30),
        arg("--seed", type=int, default=1),
        arg("--policies", default=",".join(POLICIES), help="Comma-separated: refuse, queue, queue+borrowing."),
        arg("--keep-db", action="store_true"),
        arg(
            "--forecast-bounds",
            action="store_true",
            help="Also score each first forecast with part of the future known (Replay.forecast_bounds).",
        ),
    ],
    targets=[
        *(correctness(f"policies.{p}.double_allocated", "==", 0, when=_ran(p)) for p in POLICIES),
        correctness(f"{R}.still_waiting", "==", 0, when=_ran("refuse")),
        correctness(f"{Q}.refused", "==", 0, when=_ran("queue")),
        correctness(f"{B}.refused", "==", 0, when=_ran("queue+borrowing")),
        # Simulated time: the reclaim bound is the lending contract, not the machine's speed.
        correctness(f"{B}.lender_reclaim_p99_s", "<=", f"{B}.reclaim_bound_s", when=_reclaimed),
        performance(f"{B}.mean_wait_h", "<", f"{Q}.mean_wait_h", when=_ran("queue", "queue+borrowing")),
        performance(
            f"{B}.reserved_utilisation", ">", f"{Q}.reserved_utilisation", when=_ran("queue", "queue+borrowing")
        ),
        performance(
            f"{B}.reserved_utilisation", ">", f"{R}.reserved_utilisation", when=_ran("refuse", "queue+borrowing")
        ),
        performance(f"{Q}.forecast_mae_ratio", "<=", 0.35, when=_ran("queue")),
        performance(f"{B}.forecast_mae_ratio", "<=", 0.35, when=_ran("queue+borrowing")),
    ],
    smoke=Smoke(("--gpus", "16", "--days", "2")),
)
def queue_benchmark(*, stdout, gpus, days, seed, policies, keep_db, forecast_bounds=False, **_):
    chosen = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = sorted(set(chosen) - set(POLICIES))
    if unknown or not chosen:
        raise CommandError(
            f"--policies: unknown {', '.join(unknown) or '(none given)'}; choose among {', '.join(POLICIES)}"
        )
    arrivals = generate(gpus=gpus, days=days, seed=seed)
    results: dict[str, dict] = {}
    for policy in chosen:
        started = time.perf_counter()
        with bench_database(keep_db):
            results[policy] = replay(arrivals, gpus=gpus, days=days, policy=policy, bounds=forecast_bounds)
        results[policy]["seconds"] = round(time.perf_counter() - started, 1)
        stdout.write(f"{policy}: {results[policy]}\n")
    return {
        "benchmark": "queue",
        "database": connection.vendor,
        "gpus": gpus,
        "days": days,
        "seed": seed,
        "offered_load": OFFERED_LOAD,
        "policies": results,
    }

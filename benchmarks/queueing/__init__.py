"""`python manage.py bench queue --gpus 512 --days 30 --seed 1`: a month of demand through the queue.

A synthetic month (generated from --seed) of pool requests for whole H100 GPUs, from 20 projects,
is replayed through the real services (pools.services approve/release, scheduling.queue after_submit and
process, scheduling.forecast, and for borrowing monitoring.services.lending.lend_idle and pools.lending
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
(scheduling.forecast.accuracy(): mean |first P50 - actual start| over the mean actual wait, for requests
approved out of the queue).
"""

from __future__ import annotations

import datetime as dt
import heapq
import time
from collections import defaultdict
from unittest import mock

from django.conf import settings
from django.core.management.base import CommandError
from django.db import connection

from capacity.choices import Tier
from capacity.models import Cluster
from pools import lending, services
from pools.choices import RequestState
from pools.exceptions import InsufficientCapacity
from pools.models import AutoApprovalPolicy, GpuPool, Loan, PoolRequest
from scheduling import forecast, queue
from scheduling.policy import queue_policy
from tenancy.models import Project

from ..pools import bench_database, h100_fleet
from ..registry import Smoke, arg, benchmark
from ..targets import correctness, performance
from .borrowing import BorrowingMixin
from .demand import (
    IDLE_ACTIVITY,
    OFFERED_LOAD,
    POLICIES,
    PROJECTS,
    START,
    Arrival,
    Clock,
    LenderPods,
    generate,
    on_grid,
    unsynced_commits,
)
from .figures import FiguresMixin


class Replay(BorrowingMixin, FiguresMixin):
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
        self.lender_pods = LenderPods()
        self.ticks: set[dt.datetime] = set()
        self.refused = 0
        self.cluster = None

    # --- events --------------------------------------------------------------------------------

    def push(self, at: dt.datetime, kind: str, ref: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, ref))

    def tick_at(self, at: dt.datetime) -> None:
        """A reconcile_loans beat at the first grid tick at or after `at` (once per tick)."""
        at = on_grid(at, settings.LENDING_RECONCILE_INTERVAL_S)
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
        aged = queue_policy.aged_at(at)
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

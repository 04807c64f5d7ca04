"""`python manage.py bench queue --gpus 512 --days 30 --seed 1`: a month of demand through the queue.

A synthetic month (generated from --seed) of pool requests for whole H100 GPUs, from 20 projects,
is replayed through the real services (pools.services approve/release, pools.queue after_submit and
process, pools.forecast) on the configured database, in a throwaway copy per policy, under a
simulated clock (django.utils.timezone.now is patched to the replay's time):

- refuse: today's behaviour, a request that does not fit is refused;
- queue: requests wait (`wait_if_full`); one auto-approval policy ("every request") approves the
  queue's head whenever units come free;
- queue+borrowing: not run yet: borrowing is built (pools/lending.py, docs/queue.md) but this replay
  does not model loans (lender need, borrower start on lent units, the reclaim path) yet.

The mix (per workload type: share of arrivals, sizes, median hold, share with a declared end, SM
activity) is in MIX; arrivals follow a daily cycle whose mean offers OFFERED_LOAD of the fleet.
Kubernetes is left out (provisioning and clean-up are not enqueued): the benchmark measures the
queue's decisions, not provisioning.

Reported per policy: mean_wait_h and p90_wait_h (arrival to approval, over requests that started;
requests still waiting at the end count with their wait so far), reserved_utilisation (SM-active
GPU-hours over reserved GPU-hours, from each request's synthetic SM activity), refused,
ended_waiting (their end date came while they waited), lender_reclaim_p99_s (null: no borrowing),
and for queued policies forecast_mae_ratio (pools.forecast.accuracy(): mean |first P50 - actual
start| over the mean actual wait).
"""

from __future__ import annotations

import datetime as dt
import heapq
import math
import random
import time
from dataclasses import dataclass
from unittest import mock

from django.db import connection

from capacity.choices import Tier
from capacity.models import Cluster
from pools import forecast, queue, services
from pools.choices import RequestState
from pools.exceptions import InsufficientCapacity
from pools.models import AutoApprovalPolicy, PoolRequest
from tenancy.models import Project

from .pools import _percentile, bench_database, h100_fleet
from .registry import arg, benchmark

# workload type: (share of arrivals, sizes (GPUs), median hold h, sigma of log hold, share with an end date,
#                 SM activity range)
MIX = {
    "inference": (0.35, (1, 2, 4), 48.0, 0.8, 0.7, (0.4, 0.8)),
    "training": (0.25, (4, 8), 24.0, 0.8, 0.4, (0.7, 0.95)),
    "staging": (0.20, (1, 2), 12.0, 0.7, 0.5, (0.1, 0.4)),
    "development": (0.20, (1,), 6.0, 0.7, 0.8, (0.05, 0.3)),
}
IDLE_SHARE = 0.15  # of pools that sit idle (2% SM activity), as the idle detector finds in the demo
OFFERED_LOAD = 0.95  # mean GPU-hours asked per hour, over the fleet's GPUs
PROJECTS = 20
START = dt.datetime(2026, 11, 2, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Arrival:
    at: dt.datetime
    project: int
    workload: str
    size: int
    hold_h: float
    declared: bool
    activity: float


def generate(*, gpus: int, days: int, seed: int) -> list[Arrival]:
    """A month of arrivals: a Poisson process with a daily cycle, sized to offer OFFERED_LOAD of the fleet."""
    rng = random.Random(seed)
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
        arrivals.append(
            Arrival(
                at=START + dt.timedelta(hours=t),
                project=rng.randrange(PROJECTS),
                workload=kind,
                size=rng.choice(sizes),
                hold_h=max(0.25, rng.lognormvariate(math.log(median), sigma)),
                declared=rng.random() < declared,
                activity=0.02 if idle else rng.uniform(*activity),
            )
        )


class Clock:
    def __init__(self):
        self.now = START

    def __call__(self) -> dt.datetime:
        return self.now


def replay(arrivals: list[Arrival], *, gpus: int, days: int, policy: str) -> dict:
    """Replay `arrivals` under `policy` (refuse or queue) in the current database; the figures."""
    cluster = Cluster.objects.create(name="bench", kubeconfig_path="/dev/null")
    h100_fleet(cluster, gpus, node={"tier": Tier.TRAINING})
    projects = Project.objects.bulk_create(
        Project(name=f"P{i}", slug=f"p{i}", namespace=f"p{i}") for i in range(PROJECTS)
    )
    if policy == "queue":
        AutoApprovalPolicy.objects.create(name="every request")
    clock = Clock()
    end = START + dt.timedelta(days=days)
    events: list[tuple[dt.datetime, int, str, int]] = [(a.at, i, "arrive", i) for i, a in enumerate(arrivals)]
    heapq.heapify(events)
    by_request: dict[int, Arrival] = {}
    arrived_at: dict[int, dt.datetime] = {}
    started: dict[int, dt.datetime] = {}
    refused = 0
    seq = len(arrivals)

    def schedule_release(request_id: int, at: dt.datetime) -> None:
        nonlocal seq
        arrival = by_request[request_id]
        release_at = at + dt.timedelta(hours=arrival.hold_h)
        request_end = PoolRequest.objects.filter(pk=request_id).values_list("end_at", flat=True).first()
        if request_end is not None:
            release_at = min(release_at, request_end)
        seq += 1
        heapq.heappush(events, (max(release_at, at), seq, "release", request_id))

    def note_approvals(ids, at):
        for pk in ids:
            started[pk] = at
            schedule_release(pk, at)

    with (
        mock.patch("django.utils.timezone.now", clock),
        mock.patch.object(services, "enqueue_provisioning"),
        mock.patch.object(services, "enqueue_deprovisioning"),
        mock.patch.object(services, "enqueue_queue_processing"),
    ):
        while events and events[0][0] < end:
            at, _, kind, ref = heapq.heappop(events)
            clock.now = at
            if kind == "arrive":
                arrival = arrivals[ref]
                request = services.create_request(
                    projects[arrival.project],
                    actor=None,
                    submit=True,
                    workload_type=arrival.workload,
                    isolation="full",
                    spec_kind="full",
                    product="H100-80GB",
                    count=arrival.size,
                    start_at=at,
                    end_at=at + dt.timedelta(hours=arrival.hold_h) if arrival.declared else None,
                    wait_if_full=policy == "queue",
                )
                by_request[request.pk] = arrival
                arrived_at[request.pk] = at
                if policy == "refuse":
                    try:
                        services.approve(request, actor=None)
                        note_approvals([request.pk], at)
                    except InsufficientCapacity:
                        services.reject(request, actor=None, reason="refused: capacity short")
                        refused += 1
                else:
                    queue.after_submit(request)
                    if request.state != RequestState.QUEUED:
                        note_approvals([request.pk], at)
            else:
                request = PoolRequest.objects.get(pk=ref)
                services.release(request, actor=None)
                if policy == "queue":
                    note_approvals(queue.process(now=at).approved, at)
        clock.now = end
        waits = [(started[pk] - arrived_at[pk]).total_seconds() / 3600 for pk in started]
        still = list(PoolRequest.objects.filter(state=RequestState.QUEUED).values_list("pk", flat=True))
        waits += [(end - arrived_at[pk]).total_seconds() / 3600 for pk in still]
        reserved = active = 0.0
        for pk, at in started.items():
            arrival = by_request[pk]
            held = PoolRequest.objects.filter(pk=pk).values_list("end_at", flat=True).first()
            release_at = at + dt.timedelta(hours=arrival.hold_h)
            if held is not None:
                release_at = min(release_at, held)
            hours = max(0.0, (min(release_at, end) - at).total_seconds() / 3600) * arrival.size
            reserved += hours
            active += hours * arrival.activity
        ended_waiting = PoolRequest.objects.filter(state=RequestState.REJECTED, state_reason__contains="while waiting")
        result = {
            "arrivals": len(arrivals),
            "started": len(started),
            "still_waiting": len(still),
            "mean_wait_h": round(sum(waits) / len(waits), 3) if waits else 0.0,
            "p90_wait_h": round(_percentile(waits, 0.9), 3),
            "reserved_utilisation": round(active / reserved, 3) if reserved else None,
            "refused": refused,
            "ended_waiting": ended_waiting.count(),
            "lender_reclaim_p99_s": None,
        }
        if policy == "queue":
            result["forecast_mae_ratio"] = forecast.accuracy()["mae_ratio"]
            result["forecast"] = forecast.accuracy()
    return result


@benchmark(
    "queue",
    help="A synthetic month of requests under refuse-when-full, queue, queue+borrowing; waits, use, forecast error.",
    arguments=[
        arg("--gpus", type=int, default=512),
        arg("--days", type=int, default=30),
        arg("--seed", type=int, default=1),
        arg("--policies", default="refuse,queue", help="Comma-separated: refuse, queue (one run per policy)."),
        arg("--keep-db", action="store_true"),
    ],
)
def queue_benchmark(*, stdout, gpus, days, seed, policies, keep_db, **_):
    arrivals = generate(gpus=gpus, days=days, seed=seed)
    chosen = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = sorted(set(chosen) - {"refuse", "queue"})
    if unknown:
        raise ValueError(f"--policies: unknown {', '.join(unknown)}; choose among refuse, queue")
    policies: dict[str, dict] = {}
    for policy in chosen:
        started = time.perf_counter()
        with bench_database(keep_db):
            policies[policy] = replay(arrivals, gpus=gpus, days=days, policy=policy)
        policies[policy]["seconds"] = round(time.perf_counter() - started, 1)
        stdout.write(f"{policy}: {policies[policy]}\n")
    policies["queue+borrowing"] = {"status": "not run: the replay does not model loans yet (docs/queue.md)"}
    return {
        "benchmark": "queue",
        "database": connection.vendor,
        "gpus": gpus,
        "days": days,
        "seed": seed,
        "offered_load": OFFERED_LOAD,
        "policies": policies,
    }

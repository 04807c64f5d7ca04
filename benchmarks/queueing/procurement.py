"""`python manage.py bench procurement --gpus 256 --days 30 --seed 1 --add 0,32,64`: is the what-if right?

A month of demand (bench queue's generator, benchmarks.queueing.generate(): whole H100 GPUs from 20 projects,
OFFERED_LOAD of the fleet, a daily cycle) goes through the real queue (bench queue's replay, "queue" policy:
every request auto-approved when it fits, queued otherwise) on `--gpus` GPUs. From the history that leaves in
the database, scheduling.procurement.what_if() predicts the mean wait had the fleet had N more GPUs, for each N of
`--add`. Then the same month is replayed through the real queue again on a fleet with those N GPUs really
added (a fresh database each), and each prediction is scored against it:

    wait_error_plusN = |predicted mean wait - replayed mean wait| / replayed mean wait

(0 when both are 0), with `wait_error_plusN_met` when it is at most MAX_WAIT_ERROR (docs/procurement.md). The +0
prediction is scored against the history itself. The replays with GPUs added share nothing with the
history's: each runs in a worker process (forked) beside it, in its own throwaway database. Each request's
stored start forecast (scheduling.queue refresh_forecast, which decides nothing) is not computed in these replays:
the what-if does not read it.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import time
from unittest import mock

from django.core.management.base import CommandError
from django.db import connection, connections

from capacity.choices import Tier
from scheduling import procurement, queue

from ..pools import bench_database
from ..registry import Smoke, arg, benchmark
from ..targets import correctness, performance
from . import OFFERED_LOAD, START, generate, replay

MAX_WAIT_ERROR = 0.25  # the bound (#30): at most 25 % of the replayed mean wait
PRODUCT = "H100-80GB"  # what bench queue's fleet and requests are


def _adds(text: str) -> list[int]:
    try:
        adds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CommandError(f"--add: whole GPU counts separated by commas, e.g. 0,32,64; not {text!r}") from None
    if not adds or any(n < 0 for n in adds) or len(set(adds)) != len(adds):
        raise CommandError(f"--add: distinct GPU counts, each 0 or more, e.g. 0,32,64; not {text!r}")
    return sorted(adds)


def _replay(arrivals, *, gpus: int, days: int, keep_db: bool, suffix: str = "bench", answer_at: dict | None = None):
    """The month through the real queue on `gpus` GPUs, in a fresh database named with `suffix`; with
    `answer_at`, also the what-if from its history."""
    started = time.perf_counter()
    with bench_database(keep_db, suffix=suffix), mock.patch.object(queue, "refresh_forecast"):
        result = replay(arrivals, gpus=gpus, days=days, policy="queue")
        answer = None
        if answer_at is not None:
            asked = time.perf_counter()
            answer = procurement.what_if(
                PRODUCT, Tier.TRAINING, answer_at["add"], window_days=days, now=answer_at["now"]
            )
            answer["seconds"] = round(time.perf_counter() - asked, 2)
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result, answer


def _added(arrivals, gpus: int, days: int, keep_db: bool) -> dict:
    """A replay with GPUs added, in a worker process: its own database (named after its fleet), its figures."""
    result, _ = _replay(arrivals, gpus=gpus, days=days, keep_db=keep_db, suffix=f"bench_{gpus}")
    return result


def _error(predicted: float, replayed: float) -> float | None:
    if replayed == 0:
        return 0.0 if predicted == 0 else None
    return round(abs(predicted - replayed) / replayed, 3)


def _has(figure: str):
    return lambda result: figure in result


@benchmark(
    "procurement",
    help="A month of demand at --gpus; the what-if's mean wait for +N GPUs against the queue replayed with them.",
    arguments=[
        arg("--gpus", type=int, default=256),
        arg("--days", type=int, default=30),
        arg("--seed", type=int, default=1),
        arg("--add", default="0,32,64", help="GPU counts to add, comma-separated."),
        arg("--keep-db", action="store_true"),
    ],
    targets=[
        correctness("answers", "==", "asked"),
        correctness("predicted_monotone", "==", True),
        correctness("double_allocated", "==", 0),
        *(
            performance(f"wait_error_plus{n}", "<=", MAX_WAIT_ERROR, when=_has(f"wait_error_plus{n}"))
            for n in (0, 32, 64)
        ),
        performance("max_wait_error", "<=", MAX_WAIT_ERROR),
    ],
    smoke=Smoke(("--gpus", "16", "--days", "3", "--add", "0,8")),
)
def procurement_benchmark(*, stdout, gpus, days, seed, add, keep_db, **_):
    adds = _adds(add)
    if gpus < 8 or days < 1:
        raise CommandError("--gpus must be 8 or more and --days 1 or more")
    arrivals = generate(gpus=gpus, days=days, seed=seed)
    end = START + dt.timedelta(days=days)
    # The replays with GPUs added depend on nothing the history's replay writes: each runs in a process of its
    # own (forked before any of them opens a database connection), beside the history's, in its own database.
    added = [n for n in adds if n]
    connections.close_all()
    workers = multiprocessing.get_context("fork").Pool(len(added)) if added else None
    try:
        pending = {n: workers.apply_async(_added, (arrivals, gpus + n, days, keep_db)) for n in added}
        history, answer = _replay(arrivals, gpus=gpus, days=days, keep_db=keep_db, answer_at={"add": adds, "now": end})
        stdout.write(f"history at {gpus} GPUs: {history}\n")
        replayed = {0: history}
        for n, result in pending.items():
            replayed[n] = result.get()
            stdout.write(f"replayed at {gpus + n} GPUs: {replayed[n]}\n")
    finally:
        if workers is not None:
            workers.terminate()
            workers.join()
    result: dict = {
        "benchmark": "procurement",
        "database": connection.vendor,
        "gpus": gpus,
        "days": days,
        "seed": seed,
        "offered_load": OFFERED_LOAD,
        "asked": len(adds),
        "answers": len(answer["answers"]),
        "what_if_seconds": answer["seconds"],
        "observed": answer["observed"],
        "double_allocated": sum(r["double_allocated"] for r in replayed.values()),
        "per_add": [],
    }
    errors = []
    for predicted in answer["answers"]:
        n, real = predicted["add_gpus"], replayed[predicted["add_gpus"]]
        error = _error(predicted["mean_wait_h"], real["mean_wait_h"])
        errors.append(error)
        result[f"wait_error_plus{n}"] = error
        result[f"wait_error_plus{n}_met"] = error is not None and error <= MAX_WAIT_ERROR
        result["per_add"].append(
            {
                "add_gpus": n,
                "predicted_mean_wait_h": predicted["mean_wait_h"],
                "replayed_mean_wait_h": real["mean_wait_h"],
                "wait_error": error,
                "predicted_p90_wait_h": predicted["p90_wait_h"],
                "replayed_p90_wait_h": real["p90_wait_h"],
                "predicted_utilisation": predicted["utilisation"],
                "replay_seconds": real["seconds"],
            }
        )
        stdout.write(
            f"+{n} GPUs: predicted mean wait {predicted['mean_wait_h']} h, replayed {real['mean_wait_h']} h, "
            f"error {error}\n"
        )
    waits = [a["mean_wait_h"] for a in answer["answers"]]
    result["predicted_monotone"] = waits == sorted(waits, reverse=True)
    result["max_wait_error"] = None if None in errors else max(errors)
    result["max_wait_error_met"] = result["max_wait_error"] is not None and result["max_wait_error"] <= MAX_WAIT_ERROR
    return result

"""`python manage.py bench poll-cycle`: one metrics poll cycle through thin node agents and ingest workers.

    manage.py bench poll-cycle --nodes 2000 --gpus-per-node 8 --agents 8 --workers 2 [--stall-ingest S] [--kill-agent]

Builds the simulator's "scale" scenario in this process, serves it over HTTP (SimServer), registers
and discovers it into the database (PostgreSQL), then starts real processes: --agents Celery
workers with GPUAAS_ROLE=node-agent and no DATABASE_URL, each consuming an equal share of the
nodes' queues (node.<cluster>.<node>, threads pool), and --workers `manage.py ingest-worker`
processes. A cycle is beat's fan-out (`poll_metrics_task`) until every unit of every node has its
sample at the cycle's slot committed, or until nothing more can come: the period is over (reads not started
by then have expired), nothing waits on the node or ingest queues and no sample came for SETTLE_S; or the
slot's lateness window (MONITORING_ROLLUP_LATENESS_S) has closed. At the default period (METRICS_INTERVAL_S)
it measures a first cycle (every process's first poll of every node), steady ones, and with
--stall-ingest S an overrun one (the ingest workers stopped for S seconds from the fan-out). Figures:

- cycles: per cycle (first, steady, overrun) its cycle_s, samples, lost, lost_past_lateness, overran
  (cycle_s over the period), repolled_nodes; first_lost, steady_lost, overrun_lost and
  overrun_lost_past_lateness repeat them at the top level;
- lost: samples of the cycle never written and not counted as past lateness (a late report within the
  lateness window is written, so this is 0 unless a poll was dropped unstarted or a report vanished);
  lost_past_lateness: samples of reports that arrived after the window, dropped and counted by the ingest on
  their node's collector (Collector.late_dropped_samples); the top-level `lost` is the sum over all cycles;
- cycle_s: the steady cycle's fan-out to its last sample committed, or, for a cycle left incomplete, to its
  verdict (target: within the poll period);
- floor_s / ratio_to_floor: the same rows written in-process in one `ingest_samples` call (one COPY),
  and cycle_s over it;
- samples: rows the cycle wrote; expected: units of the present nodes (GPUs + active MIG instances);
- db_connections_max: the most backends pg_stat_activity showed on the bench database during the
  cycle, sampled every 50 ms (this process's two connections included);
- lost: expected - samples once the cycle is over (or its deadline passed); duplicated: rows beyond
  one per (ts, series) (the primary key makes it 0; counted, not assumed);
- ingest_cpu_s / ingest_cpu_ms_per_report: CPU seconds (user + system, /proc/<pid>/stat) the ingest
  workers used during the steady cycle, and per node report (first_* the first cycle's, phased_* the phased
  one's); agent_cpu_s / agent_cpu_ms_per_read: the
  same for the agent processes, per node read (Celery's own work included); sim_cpu_ms_per_read: this
  process's CPU per node read (the SimServer answering the agents' NVML sessions, and the cycle's own
  polling). CPU time does not depend on how busy the machine is, wall time does: size from these;
- with --kill-agent: agent 0 is SIGKILLed once a quarter of the samples are in and restarted (as
  its DaemonSet would); the next cycle is measured too (next_cycle_*);
- with --kill-ingest: ingest worker 0 is SIGKILLed in the first cycle while it holds reports it took and has not
  acknowledged (mid-batch), and restarted; another worker claims them after AGENT_INGEST_VISIBILITY_S, and they
  are written (the re-poll may read the node again first); the run then waits for the claim
  (in_flight_at_end: reports still unacknowledged, target 0) and counts lost and duplicated again over every
  cycle: lost == 0, duplicated == 0 say nothing was lost or written twice;
- --lateness S: MONITORING_ROLLUP_LATENESS_S for this run's ingest workers (and the cycles' wait), to see
  lost_past_lateness counted without waiting ten minutes (--stall-ingest above it).

`PollFleet` (the processes) is also what tests/faults/test_fault_agents.py runs.
"""

from __future__ import annotations

import gc
import os
import signal
import tempfile
import time
from functools import partial
from pathlib import Path
from unittest import mock

from django.conf import settings
from django.db import connection

from capacity.agent import transport
from capacity.models import Cluster, NodeCapacity
from capacity.services.discovery import INVENTORY_NONE, discover_cluster
from capacity.services.inventory import reconcile_inventory
from monitoring.models import Collector, Sample
from monitoring.services.collect import poll_slot
from monitoring.tasks import poll_metrics_task, repoll_missing_task

from ..capacity import _read_inventories, _serve, delete_bench_clusters, stale_bench_clusters, unique_name
from ..registry import Smoke, arg, benchmark
from ..targets import correctness, performance
from .poll_fleet import (
    BENCH_PREFIX,
    CPU_FIGURES,
    SETTLE_S,
    ConnectionSampler,
    CpuMeter,
    PollFleet,
    cpu_figures,
    duplicated,
    expected_units,
    holds_reports,
    ingest_floor_s,
    ingest_queue_length,
    late_dropped,
    queued,
    split_queues,
    wait_for_slot_boundary,
    wait_ready,
    written,
)


def run_cycle(
    cluster: Cluster,
    expected: int,
    *,
    deadline_s: float | None = None,
    during=None,
    pause=None,
    stall=None,
    clear=False,
    meter=None,
    node_queues: list[str] | None = None,
    fresh_slot: bool = False,
) -> dict:
    """Beat's fan-out, then wait until `expected` samples of this slot are in, or nothing more can come.

    The wait ends at `deadline_s` from the fan-out, at the latest when the slot's lateness window has closed
    (a report ingested after that is dropped and counted), or once the period is over, nothing waits on
    `node_queues` or the ingest queue and no sample came for SETTLE_S (reads not started by the period's end
    have expired: only what is in flight can still come).
    `pause=(fleet, reports)`: the ingest workers are stopped (SIGSTOP) until `reports` reports are queued
    (agents_s), then continued (ingest_s: the control plane alone). `stall=(fleet, seconds)`: the ingest
    workers are stopped for that long from the fan-out (an overrun). `clear`: delete the cluster's samples
    of this slot first, so a cycle can reuse the slot of the one before (no wait for the next slot).
    `fresh_slot`: first sleep into the next slot, and fan out at its start as beat does (the lateness window
    and the re-poll's "reported since the slot began" then mean what they mean in production).
    `meter` (a CpuMeter): started with the fan-out, sampled about every second and at the end.
    """
    ts = wait_for_slot_boundary(settings.METRICS_INTERVAL_S) if fresh_slot else poll_slot()
    period = settings.METRICS_INTERVAL_S
    lateness_end = ts.timestamp() + settings.MONITORING_ROLLUP_LATENESS_S
    if clear:
        Sample.objects.filter(ts=ts, series__gpu__node__cluster=cluster).delete()
    dropped_before = late_dropped(cluster)
    phases = {}
    stopped = pause[0].workers if pause is not None else stall[0].workers if stall is not None else []
    for worker in stopped:
        worker.send_signal(signal.SIGSTOP)
    repolled = None
    with ConnectionSampler() as sampler:
        if meter is not None:
            meter.start()
        started = time.monotonic()
        # Past the window, one more settle for the ingest's verdict on the last late reports.
        limit = max(lateness_end - time.time(), period, stall[1] if stall is not None else 0) + 2 * SETTLE_S
        limit = min(limit, deadline_s) if deadline_s is not None else limit
        sampled = started
        with mock.patch.object(
            repoll_missing_task, "apply_async"
        ):  # run below, in this process, as beat's worker would
            poll_metrics_task()  # autocommit: the fan-out is sent at once (on_commit)
        if pause is not None:
            try:
                want = pause[1]
                while ingest_queue_length() < want and time.monotonic() - started < limit:
                    time.sleep(0.05)
            finally:
                phases["agents_s"] = time.monotonic() - started
                for worker in pause[0].workers:
                    worker.send_signal(signal.SIGCONT)
        count, last, last_change = 0, -1, started  # last_change: when the count last moved
        resumed = stall is None
        while time.monotonic() - started < limit:
            now = time.monotonic()
            if not resumed and now - started >= stall[1]:
                for worker in stall[0].workers:
                    worker.send_signal(signal.SIGCONT)
                resumed = True
            count = written(cluster, ts)
            if count != last:
                last, last_change = count, now
            if meter is not None and (count >= expected or now - sampled >= 1.0):
                meter.sample()
                sampled = now
            if during is not None:
                during(count)
            if count >= expected:
                break
            if repolled is None and now - started >= settings.METRICS_REPOLL_AFTER_S:
                repolled = repoll_missing_task(int(ts.timestamp()))
            if (
                resumed
                and node_queues is not None
                and now - started >= period
                and now - last_change >= SETTLE_S
                and queued(node_queues) == 0
            ):
                break
            time.sleep(0.05)
        if not resumed:
            for worker in stall[0].workers:
                worker.send_signal(signal.SIGCONT)
        # An incomplete cycle lasted until its verdict (nothing more could come, or the window closed).
        cycle_s = time.monotonic() - started
    if meter is not None:
        meter.sample()
    if pause is not None:
        phases["ingest_s"] = cycle_s - phases["agents_s"]
    # The collectors count every late report's samples; a node read twice (the re-poll) counts twice there.
    past_lateness = min(late_dropped(cluster) - dropped_before, expected - count)
    return {
        "ts": ts,
        "cycle_s": cycle_s,
        **phases,
        "samples": count,
        "repolled_nodes": repolled or 0,
        "lost": expected - count - past_lateness,
        "lost_past_lateness": past_lateness,
        "overran": cycle_s > period,
        "duplicated": duplicated(cluster, ts),
        "db_connections_max": sampler.peak,
        **(cpu_figures(meter, meter.reads + (repolled or 0)) if meter is not None else {}),
    }


@benchmark(
    "poll-cycle",
    help="Metrics poll cycles through thin node agents (no database) and batch ingest workers (PostgreSQL, Redis).",
    arguments=[
        arg("--nodes", type=int, default=2000),
        arg("--gpus-per-node", type=int, default=8),
        arg("--agents", type=int, default=8, help="node-agent processes, each serving nodes/agents node queues"),
        arg("--workers", type=int, default=2, help="ingest-worker processes"),
        arg("--threads", type=int, default=8, help="threads per agent process (concurrent node reads)"),
        arg("--kill-agent", action="store_true", help="SIGKILL agent 0 mid-cycle and restart it"),
        arg(
            "--kill-ingest",
            action="store_true",
            help="SIGKILL ingest worker 0 mid-batch (reports taken, not acknowledged) in the first cycle, restart it",
        ),
        arg("--cycles", type=int, default=2, help="end-to-end cycles: the first, then steady ones (median: cycle_s)"),
        arg(
            "--stall-ingest",
            type=float,
            default=0,
            metavar="S",
            help="then one overrun cycle: the ingest workers stopped for S seconds from its fan-out",
        ),
        arg("--phased-only", action="store_true", help="only the phased cycle (cycle_s = its agents + ingest phases)"),
        arg(
            "--period",
            type=int,
            default=None,
            help="poll period and read expiry for this run (default METRICS_INTERVAL_S, which the figures use)",
        ),
        arg(
            "--lateness",
            type=int,
            default=None,
            help="MONITORING_ROLLUP_LATENESS_S for this run (default: the setting); below --stall-ingest to see"
            " lost_past_lateness counted",
        ),
    ],
    targets=[
        correctness("lost", "==", 0),
        correctness("first_lost", "==", 0, when=lambda r: "first_lost" in r),
        correctness("steady_lost", "==", 0, when=lambda r: "steady_lost" in r),
        correctness("overrun_lost", "==", 0, when=lambda r: "overrun_lost" in r),
        correctness("phased_lost", "==", 0),
        correctness("duplicated", "==", 0),
        correctness("db_connections_max", "<=", 20),
        correctness("next_cycle_lost", "==", 0, when=lambda r: "next_cycle_lost" in r),
        correctness("in_flight_at_end", "==", 0, when=lambda r: "in_flight_at_end" in r),
        performance("cycle_s", "<=", "period_s"),
        performance("ingest_cpu_ms_per_report", "<=", 2),
    ],
    smoke=Smoke(
        ("--nodes", "4", "--gpus-per-node", "2", "--agents", "1", "--workers", "1", "--threads", "2", "--cycles", "1"),
        needs=("postgresql", "redis"),
    ),
)
def run_poll_cycle(
    *,
    stdout,
    nodes: int,
    gpus_per_node: int,
    agents: int,
    workers: int,
    threads: int,
    kill_agent: bool,
    kill_ingest: bool,
    cycles: int,
    stall_ingest: float,
    period: int | None,
    lateness: int | None,
    phased_only: bool,
) -> dict:
    if connection.vendor != "postgresql" or not settings.CELERY_BROKER_URL.startswith("redis"):
        return {
            "error": "poll-cycle needs PostgreSQL and Redis (DATABASE_URL=postgres://..., CELERY_BROKER_URL=redis://...)"
        }
    if agents < 1 or workers < 1 or nodes < agents:
        return {"error": "--agents and --workers must be at least 1, and --nodes at least --agents"}
    period = period or settings.METRICS_INTERVAL_S
    lateness = settings.MONITORING_ROLLUP_LATENESS_S if lateness is None else lateness
    if period < 5 or lateness < 0 or stall_ingest < 0:
        return {"error": "--period must be at least 5 (seconds), --lateness and --stall-ingest at least 0"}
    saved = settings.METRICS_INTERVAL_S, settings.METRICS_REPOLL_AFTER_S, settings.MONITORING_ROLLUP_LATENESS_S
    settings.METRICS_INTERVAL_S, settings.METRICS_REPOLL_AFTER_S = period, period * 2 // 3
    settings.MONITORING_ROLLUP_LATENESS_S = lateness
    with tempfile.TemporaryDirectory() as tmp:
        stdout.write(f"# building the scale scenario: {nodes} nodes x {gpus_per_node} GPUs")
        server, kubeconfig = _serve(nodes, gpus_per_node, Path(tmp))
        gc.collect()
        gc.freeze()
        fleet = None
        cluster = None
        try:
            cluster = Cluster.objects.create(name=unique_name(BENCH_PREFIX, nodes), kubeconfig_path=str(kubeconfig))
            _discover(cluster, server)
            others = NodeCapacity.objects.present().filter(gpu_count__gt=0).exclude(cluster=cluster).count()
            if others:
                stdout.write(f"# note: {others} GPU nodes of other clusters get polls too (queues no agent serves)")
            names = list(
                NodeCapacity.objects.present()
                .filter(cluster=cluster, gpu_count__gt=0)
                .order_by("name")
                .values_list("cluster__name", "name")
            )
            expected = expected_units(cluster)
            stdout.write(f"# {len(names)} nodes, {expected} units; {agents} agents, {workers} ingest workers")
            queues = split_queues(names, agents)
            fleet = PollFleet(
                Path(tmp) / "logs",
                queues=queues,
                workers=workers,
                threads=threads,
                env={"METRICS_INTERVAL_S": str(period), "MONITORING_ROLLUP_LATENESS_S": str(lateness)},
            )
            fleet.start()
            wait_ready(fleet, timeout_s=300)
            node_queues = [q for share in queues for q in share]
            cycle = partial(run_cycle, cluster, expected, fresh_slot=True, node_queues=node_queues)
            runs: list[tuple[str, dict]] = []
            killed = {}

            meter = CpuMeter(fleet, reads=len(names))

            def kill_once(count: int) -> None:
                if kill_agent and "exit" not in killed and count >= expected // 4:
                    meter.sample()  # the killed agent's CPU up to its death
                    killed["exit"] = fleet.kill(fleet.agents[0])
                    killed["at_samples"] = count
                    fleet.replace_dead()
                if kill_ingest and "ingest_exit" not in killed and count and holds_reports(fleet.workers[0]):
                    meter.sample()
                    killed["ingest_exit"] = fleet.kill(fleet.workers[0])
                    killed["ingest_at_samples"] = count
                    fleet.replace_dead()

            for n in range(0 if phased_only else max(1, cycles)):
                name = "first" if n == 0 else "steady"
                runs.append((name, cycle(during=kill_once if n == 0 else None, meter=meter)))
                stdout.write(f"# {name} cycle {n + 1}: {_short(runs[-1][1])}")
            if stall_ingest and not phased_only:
                runs.append(("overrun", cycle(stall=(fleet, stall_ingest), meter=meter)))
                stdout.write(f"# overrun cycle (ingest stalled {stall_ingest} s): {_short(runs[-1][1])}")
            if kill_agent or kill_ingest:
                wait_ready(fleet, timeout_s=300)
            # The same cycle in two phases: ingest workers paused (SIGSTOP) until every report is queued.
            split = cycle(pause=(fleet, len(names)), meter=meter)
            stdout.write(f"# phased cycle: {_short(split)}")
            runs = runs or [("phased", split)]
            first = runs[0][1]
            steady = [r for name, r in runs if name == "steady"] or [first]
            everything = [r for _, r in runs] + [split]
            floor = ingest_floor_s(cluster, first["ts"]) if first["samples"] else None
            cycle_s = sorted(r["cycle_s"] for r in steady)[len(steady) // 2]
            result = {
                "nodes": len(names),
                "gpus_per_node": gpus_per_node,
                "agents": agents,
                "workers": workers,
                "threads_per_agent": threads,
                "period_s": period,
                "lateness_s": lateness,
                "stall_ingest_s": stall_ingest,
                "expected": expected,
                "cycle_s": round(cycle_s, 3),
                "cycles": [_cycle_figures(name, r) for name, r in runs],
                "samples": first["samples"],
                "lost": sum(r["lost"] for r in everything),
                "lost_past_lateness": sum(r["lost_past_lateness"] for r in everything),
                **{f"{name}_lost": r["lost"] for name, r in runs},
                **{f"{name}_lost_past_lateness": r["lost_past_lateness"] for name, r in runs if name == "overrun"},
                "duplicated": sum(r["duplicated"] for r in everything),
                "floor_s": None if floor is None else round(floor, 3),
                "ratio_to_floor": None if not floor else round(cycle_s / floor, 1),
                "agents_phase_s": round(split["agents_s"], 3),
                "ingest_phase_s": round(split["ingest_s"], 3),
                "ingest_ratio_to_floor": None if not floor else round(split["ingest_s"] / floor, 2),
                "phased_lost": split["lost"],
                "repolled_nodes": sum(r["repolled_nodes"] for r in everything),
                "agent_read_ms_median": _median_read_ms(cluster),
                "db_connections_max": max(r["db_connections_max"] for r in everything),
                # CPU (contention-independent): the steady cycle's (median one), the first's and the phased one's
                **{k: round(_median_run(steady)[k], 2) for k in CPU_FIGURES},
                **{f"first_{k}": round(first[k], 2) for k in CPU_FIGURES},
                **{f"phased_{k}": round(split[k], 2) for k in CPU_FIGURES},
                "load_average_1m": round(os.getloadavg()[0], 2),
                "cpus": os.cpu_count(),
            }
            if kill_agent:
                result |= {
                    "killed_agent_exit": killed.get("exit"),
                    "killed_at_samples": killed.get("at_samples"),
                    "next_cycle_samples": split["samples"],
                    "next_cycle_lost": split["lost"],
                }
            if kill_ingest:
                # The killed worker's batch is claimed by another after the visibility timeout: wait for it, then
                # count again (a claimed report written twice would show here).
                deadline = time.monotonic() + settings.AGENT_INGEST_VISIBILITY_S + 2 * SETTLE_S
                while transport.in_flight() and time.monotonic() < deadline:
                    time.sleep(0.5)
                result |= {
                    "killed_ingest_exit": killed.get("ingest_exit"),
                    "killed_ingest_at_samples": killed.get("ingest_at_samples"),
                    "in_flight_at_end": transport.in_flight(),
                    "duplicated": sum(duplicated(cluster, r["ts"]) for r in everything),
                    "lost": sum(expected - written(cluster, r["ts"]) - r["lost_past_lateness"] for r in everything),
                }
            return result
        finally:
            settings.METRICS_INTERVAL_S, settings.METRICS_REPOLL_AFTER_S, settings.MONITORING_ROLLUP_LATENESS_S = saved
            if fleet is not None:
                fleet.stop()
            gc.unfreeze()
            server.stop()
            if cluster is not None:
                delete_bench_clusters(Cluster.objects.filter(pk=cluster.pk))
            delete_bench_clusters(stale_bench_clusters(BENCH_PREFIX))


def _median_run(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda r: r["cycle_s"])[len(runs) // 2]


def _cycle_figures(name: str, run: dict) -> dict:
    keys = ("cycle_s", "samples", "lost", "lost_past_lateness", "overran", "repolled_nodes", "duplicated")
    return (
        {"cycle": name}
        | {k: round(run[k], 3) if isinstance(run[k], float) else run[k] for k in keys}
        | {"ingest_cpu_ms_per_report": round(run["ingest_cpu_ms_per_report"], 2)}
    )


def _median_read_ms(cluster: Cluster) -> int | None:
    """The agents' own time per node read (NVML, GPM's sleep included), as their last reports said."""
    values = sorted(Collector.objects.filter(cluster=cluster).values_list("last_duration_ms", flat=True))
    return values[len(values) // 2] if values else None


def _short(run: dict) -> str:
    return ", ".join(f"{k}={round(v, 3) if isinstance(v, float) else v}" for k, v in run.items() if k != "ts")


def _discover(cluster: Cluster, server) -> None:
    outcome = discover_cluster(cluster.pk, inventory=INVENTORY_NONE)
    if outcome.run.status != "succeeded":
        raise RuntimeError(f"discovery failed: {outcome.run.error}")
    inventories, _ = _read_inventories(cluster, server)
    result = reconcile_inventory(cluster.pk, inventories)
    if result.errors:
        raise RuntimeError(f"inventory failed: {result.errors}")

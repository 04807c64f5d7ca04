"""`bench poll-cycle`'s simulated fleet (PollFleet: thin node agents and ingest workers as processes), its meters
(process CPU, database connections) and the counts a cycle is judged by."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.db import connection, connections
from django.db.models import Count, Sum

from capacity.agent import transport
from capacity.models import Cluster, GpuCapacity, MigInstance, NodeCapacity
from core.celery import app, node_queue
from monitoring.models import SAMPLE_COLUMNS, Collector, Sample
from monitoring.services.collect import poll_slot
from monitoring.services.ingest import ingest_samples

REPO = Path(__file__).resolve().parents[2]
BENCH_PREFIX = "bench-poll-"


def database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class PollFleet:
    """Node-agent and ingest-worker processes for one cluster's nodes; killed ones can be replaced.

    `queues[i]` are agent i's node queues. Agents get no DATABASE_URL (GPUAAS_ROLE=node-agent);
    ingest workers get the database. `env` is added to every process's environment.
    """

    def __init__(self, logs: Path, *, queues: list[list[str]], workers: int, threads: int = 8, env: dict | None = None):
        self.logs = logs
        self.logs.mkdir(parents=True, exist_ok=True)
        self.queues = queues
        self.threads = threads
        base = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "gpuaas.settings",
            "AGENT_SIGNING_SECRET": settings.AGENT_SIGNING_SECRET,
            **(env or {}),
        }
        # Simulated agents: the simulator's NVML over HTTP, and the secret (each serves many nodes).
        self.agent_env = {k: v for k, v in base.items() if k != "DATABASE_URL"} | {
            "GPUAAS_ROLE": "node-agent",
            "NVML_LIBRARY": "simcluster.nvml.library_for_node",
        }
        self.worker_env = base | {"DATABASE_URL": database_url()}
        self.agents: list[subprocess.Popen] = [None] * len(queues)
        self.workers: list[subprocess.Popen] = [None] * workers
        self.started = 0
        self.exit_codes: list[int] = []  # of every process that died and was replaced

    def _spawn(self, name: str, argv: list[str], env: dict) -> subprocess.Popen:
        self.started += 1
        log = open(self.logs / f"{name}-{self.started}.log", "wb")  # noqa: SIM115 - closed with the process
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def start_agent(self, i: int) -> None:
        self.agents[i] = self._spawn(
            f"agent{i}",
            [sys.executable, "-m", "celery", "-A", "gpuaas", "worker", "-P", "threads", "-c", str(self.threads)]
            + ["-Q", ",".join(self.queues[i]), "-n", f"agent{i}-{self.started}@localhost", "-l", "WARNING"]
            + ["--without-heartbeat", "--without-gossip", "--without-mingle"],
            self.agent_env,
        )

    def start_worker(self, j: int) -> None:
        self.workers[j] = self._spawn(
            f"ingest{j}", [sys.executable, "manage.py", "ingest-worker", "-v", "0"], self.worker_env
        )

    def start(self) -> None:
        for i in range(len(self.agents)):
            self.start_agent(i)
        for j in range(len(self.workers)):
            self.start_worker(j)

    def replace_dead(self) -> int:
        """Restart every process that exited (a DaemonSet or Deployment would); how many were."""
        dead = 0
        for processes, start in ((self.agents, self.start_agent), (self.workers, self.start_worker)):
            for i, process in enumerate(processes):
                if process is None or process.poll() is not None:
                    if process is not None:
                        self.exit_codes.append(process.returncode)
                    start(i)
                    dead += 1
        return dead

    def kill(self, process: subprocess.Popen) -> int:
        process.send_signal(signal.SIGKILL)
        return process.wait(30)

    def stop(self) -> None:
        for process in self.agents + self.workers:
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait(30)

    def cpu_s(self) -> dict[str, dict[int, float]]:
        """CPU seconds (user + system) each live agent and ingest worker has used so far, by pid."""
        return {
            "agents": {p.pid: process_cpu_s(p.pid) for p in self.agents if p is not None and p.poll() is None},
            "workers": {p.pid: process_cpu_s(p.pid) for p in self.workers if p is not None and p.poll() is None},
        }

    def log_tail(self) -> str:
        return "\n".join(f"== {p.name}\n" + p.read_text(errors="replace")[-2000:] for p in sorted(self.logs.iterdir()))


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process from /proc/<pid>/stat, in seconds (0.0 if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": field 3 (state) is fields[0]
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


class CpuMeter:
    """CPU the fleet's processes use between start() and the last sample(): a process replaced meanwhile
    counts up to its last sample (take one just before a kill)."""

    def __init__(self, fleet: PollFleet, *, reads: int):
        self.fleet = fleet
        self.reads = reads  # node reads (reports) a cycle asks for; a re-poll's are added by run_cycle
        self.first: dict[str, dict[int, float]] = {}
        self.last: dict[str, dict[int, float]] = {"agents": {}, "workers": {}}
        self.own = 0.0

    def start(self) -> None:
        self.first = self.fleet.cpu_s()
        self.last = {kind: dict(pids) for kind, pids in self.first.items()}
        self.own = time.process_time()

    def sample(self) -> None:
        for kind, pids in self.fleet.cpu_s().items():
            self.last[kind].update(pids)

    def used_s(self, kind: str) -> float:
        return sum(cpu - self.first.get(kind, {}).get(pid, 0.0) for pid, cpu in self.last[kind].items())

    def own_s(self) -> float:
        return time.process_time() - self.own


def split_queues(nodes: list[tuple[str, str]], agents: int) -> list[list[str]]:
    """Each agent's share of the node queues (round robin)."""
    return [[node_queue(c, n) for c, n in nodes[i::agents]] for i in range(agents)]


def expected_units(cluster: Cluster) -> int:
    """Samples one complete poll of the cluster writes: present GPUs and their active MIG instances."""
    nodes = NodeCapacity.objects.present().filter(cluster=cluster, gpu_count__gt=0)
    gpus = GpuCapacity.objects.filter(node__in=nodes, lost_at__isnull=True).count()
    return gpus + MigInstance.objects.active().filter(gpu__node__in=nodes, gpu__lost_at__isnull=True).count()


def written(cluster: Cluster, ts: datetime) -> int:
    return Sample.objects.filter(ts=ts, series__gpu__node__cluster=cluster).count()


def duplicated(cluster: Cluster, ts: datetime) -> int:
    """Rows beyond one per (ts, series) at `ts`."""
    rows = Sample.objects.filter(ts=ts, series__gpu__node__cluster=cluster)
    return rows.count() - rows.values("series_id").annotate(n=Count("ts")).count()


class ConnectionSampler:
    """The most backends pg_stat_activity shows on this database, sampled every `every_s` in a thread."""

    def __init__(self, every_s: float = 0.05):
        self.every_s = every_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with connections["default"].cursor() as cursor:
                while not self._stop.is_set():
                    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
                    self.peak = max(self.peak, cursor.fetchone()[0])
                    self._stop.wait(self.every_s)
        finally:
            connections["default"].close()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def wait_for_slot_boundary(period: int) -> datetime:
    """Sleep into the next poll slot (a fresh slot per cycle); returns it."""
    now = time.time()
    time.sleep(period - now % period + 0.05)
    return poll_slot()


def ingest_queue_length() -> int:
    """Reports on the ingest stream not yet acknowledged (waiting, or delivered to a worker: a stopped worker
    blocked in XREADGROUP is still handed entries by Redis)."""
    return transport.in_flight()


SETTLE_S = 5.0  # after the period: no new sample and nothing queued for this long ends a cycle


def queued(node_queues: list[str]) -> int:
    """Messages waiting on these node queues and reports waiting on (or taken from, not acknowledged) the ingest
    stream, in one round trip."""
    with app.connection_for_write() as conn:
        pipe = conn.default_channel.client.pipeline()
        for name in node_queues:
            pipe.llen(name)
        pipe.xlen(transport.STREAM_KEY)
        return sum(pipe.execute())


def holds_reports(worker: subprocess.Popen) -> bool:
    """Whether this ingest worker has taken reports it has not acknowledged yet (mid-batch)."""
    summary = transport.client().xpending(transport.STREAM_KEY, transport.GROUP)
    name = f"{socket.gethostname()}-{worker.pid}".encode()
    return any(c["name"] == name and c["pending"] for c in summary.get("consumers") or [])


def late_dropped(cluster: Cluster) -> int:
    """Samples the ingest has dropped as past the lateness window, so far, on this cluster's collectors."""
    return Collector.objects.filter(cluster=cluster).aggregate(n=Sum("late_dropped_samples"))["n"] or 0


CPU_FIGURES = (
    "ingest_cpu_s",
    "ingest_cpu_ms_per_report",
    "agent_cpu_s",
    "agent_cpu_ms_per_read",
    "sim_cpu_ms_per_read",
)


def cpu_figures(meter: CpuMeter, reports: int) -> dict:
    """CPU of the cycle's processes, in total and per node report."""
    ingest, agents, own = meter.used_s("workers"), meter.used_s("agents"), meter.own_s()
    return {
        "ingest_cpu_s": ingest,
        "agent_cpu_s": agents,
        "sim_cpu_s": own,
        "ingest_cpu_ms_per_report": 1000 * ingest / reports,
        "agent_cpu_ms_per_read": 1000 * agents / reports,
        "sim_cpu_ms_per_read": 1000 * own / reports,
    }


def ingest_floor_s(cluster: Cluster, ts: datetime) -> float:
    """The cycle's rows written again in-process in one ingest_samples call, a day earlier (then removed)."""
    rows = list(Sample.objects.filter(ts=ts, series__gpu__node__cluster=cluster).values_list(*SAMPLE_COLUMNS))
    earlier = datetime.fromtimestamp(ts.timestamp() - 86400, tz=UTC)
    shifted = [(earlier, *row[1:]) for row in rows]
    shifted.sort(key=lambda row: row[2])
    started = time.perf_counter()
    ingest_samples(shifted)
    elapsed = time.perf_counter() - started
    Sample.objects.filter(ts=earlier, series__gpu__node__cluster=cluster).delete()
    return elapsed


def wait_ready(fleet: PollFleet, *, timeout_s: float) -> None:
    """Until every agent answers a ping (Celery control) or the timeout; raises with the logs if not."""
    deadline = time.monotonic() + timeout_s
    want = len(fleet.agents)
    while time.monotonic() < deadline:
        replies = app.control.ping(timeout=1.0) or []
        if sum(1 for r in replies for name in r if name.startswith("agent")) >= want:
            return
        time.sleep(0.5)
    raise RuntimeError(f"agents did not start within {timeout_s} s:\n{fleet.log_tail()}")

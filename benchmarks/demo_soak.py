"""`bench demo-soak --minutes N`: run the whole demo (the `make demo` code path) and use it like a person would.

It starts `manage.py demo` in a fresh (or the given) GPUAAS_VAR_DIR on free ports with the embedded
default (DATABASE_URL and CELERY_BROKER_URL are removed from its environment), logs in as the demo
operator and member, makes an API token, then every `--interval` seconds fetches every page of
`SOAK_PAGES`, reads the screens' cross-check (CROSSCHECK_PATH: its disagreements are `contradictions`)
and the demo's supervisor status (var/demo-status.json). At the end it stops the
demo with SIGINT (what Ctrl-C sends) and reports crashes (unexpected process exits, the demo's own
included), restarts, requests and failures. Every answer other than 200 is a failure.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
from django.conf import settings

from .registry import Smoke, arg, benchmark
from .targets import correctness

# (name, who, path): who is "anon", "operator" (admin session), "member" (project session),
# "token" (API bearer token of the operator) or "metrics" (MONITORING_METRICS_TOKEN).
SOAK_PAGES: list[tuple[str, str, str]] = [
    ("admin login page", "anon", "/admin/login/"),
    ("project login page", "anon", "/accounts/login/"),
    ("admin index", "operator", "/admin/"),
    ("dashboard", "operator", "/admin/dashboard/"),
    ("dashboard json", "operator", "/admin/dashboard/data.json"),
    ("approval queue", "operator", "/admin/pools/poolrequest/"),
    ("project list", "member", "/projects/"),
    ("project view", "member", "/projects/vision/"),
    ("api clusters", "token", "/api/v1/capacity/clusters/"),
    ("api nodes", "token", "/api/v1/capacity/nodes/"),
    ("api gpus", "token", "/api/v1/capacity/gpus/"),
    ("api discovery runs", "token", "/api/v1/capacity/discovery-runs/"),
    ("api projects", "token", "/api/v1/projects/"),
    ("api pool requests", "token", "/api/v1/pool-requests/"),
    ("api pools", "token", "/api/v1/pools/"),
    ("api allocations", "token", "/api/v1/allocations/"),
    ("api health events", "token", "/api/v1/monitoring/health-events/"),
    ("api pool utilisation", "token", "/api/v1/monitoring/pools/"),
    ("api statements", "token", "/api/v1/billing/statements/"),
    ("api docs", "anon", "/api/docs/"),
    ("api schema", "anon", "/api/schema/"),
    ("metrics", "metrics", "/metrics"),
]

# The screens' cross-check (gpuaas.dashboard.crosscheck, operator JSON): every profile on every node, as the
# dashboard, node view, form check, dry run, forecast and approval say it. Read as the operator each round.
CROSSCHECK_PATH = "/admin/dashboard/crosscheck.json"

TASK_DONE = re.compile(rb"celery\.app\.trace: Task \S+ succeeded in ")


@dataclass
class SoakTally:
    """What a soak saw; `result()` turns it into the benchmark's JSON."""

    minutes: float
    rounds: int = 0
    requests: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    first_failures: list[str] = field(default_factory=list)
    supervisor: dict = field(default_factory=dict)
    demo_died: bool = False
    demo_exit: int | None = None
    tasks_processed: int | None = None
    discovery_runs: int | None = None
    trespass_events: int | None = None
    contradictions: int = 0
    crosschecks: int = 0
    first_contradictions: list[str] = field(default_factory=list)

    def record(self, name: str, ok: bool, detail: str = "") -> None:
        self.requests += 1
        if not ok:
            self.failures[name] = self.failures.get(name, 0) + 1
            if len(self.first_failures) < 20:
                self.first_failures.append(f"{time.strftime('%H:%M:%S')} {name}: {detail}")

    def result(self) -> dict:
        crashes = self.supervisor.get("crashes", 0) + (1 if self.demo_died else 0)
        failed = sum(self.failures.values())
        return {
            "minutes": self.minutes,
            "rounds": self.rounds,
            "pages": len(SOAK_PAGES),
            "crashes": crashes,
            "restarts": self.supervisor.get("restarts", 0),
            "crashes_by_process": {
                name: p["crashes"] for name, p in self.supervisor.get("programs", {}).items() if p["crashes"]
            }
            | ({"demo": 1} if self.demo_died else {}),
            "requests": self.requests,
            "failed_requests": failed,
            "failed_by_page": dict(sorted(self.failures.items())),
            "all_pages_answered_throughout": failed == 0 and not self.demo_died and self.rounds > 0,
            "tasks_processed": self.tasks_processed,
            "discovery_runs": self.discovery_runs,
            "demo_exit": self.demo_exit,
            "trespass_events": self.trespass_events,
            "crosschecks": self.crosschecks,
            "contradictions": self.contradictions,
        }

    def crosschecked(self, answer: dict) -> None:
        """One round's cross-check: its disagreements add to `contradictions` (the first few are kept to print)."""
        self.crosschecks += 1
        self.contradictions += answer["contradictions"]
        for item in answer["items"][: max(0, 20 - len(self.first_contradictions))]:
            self.first_contradictions.append(f"{time.strftime('%H:%M:%S')} {item['message']}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _login(base: str, path: str, username: str, password: str):
    session = requests.Session()
    session.get(base + path, timeout=30)
    response = session.post(
        base + path,
        data={"username": username, "password": password, "csrfmiddlewaretoken": session.cookies["csrftoken"]},
        headers={"Referer": base + path},
        timeout=30,
        allow_redirects=False,
    )
    if response.status_code != 302:
        raise RuntimeError(f"login of {username} at {path} answered {response.status_code}")
    return session


def _count_tasks(log: Path, offset: int) -> int:
    if not log.exists():
        return 0
    with open(log, "rb") as handle:
        handle.seek(offset)
        return len(TASK_DONE.findall(handle.read()))


def _count(var_dir: Path, sql: str) -> int | None:
    """One count from the demo's SQLite database, read-only; None when it cannot be read."""
    try:
        with sqlite3.connect(f"file:{var_dir / 'gpuaas.sqlite3'}?mode=ro", uri=True, timeout=30) as db:
            return db.execute(sql).fetchone()[0]
    except sqlite3.Error:
        return None


def _discovery_runs(var_dir: Path) -> int | None:
    return _count(var_dir, "SELECT count(*) FROM capacity_discoveryrun WHERE status = 'succeeded'")


def _trespass_events(var_dir: Path) -> int | None:
    """Trespass events ever recorded: the demo world has none (docs/demo.md), so each one is a false alarm."""
    return _count(var_dir, "SELECT count(*) FROM monitoring_trespassevent")


@benchmark(
    "demo-soak",
    "Run the whole demo for N minutes, fetch every page periodically, count crashes, restarts and failures.",
    [
        arg("--minutes", type=float, default=10.0),
        arg("--interval", type=float, default=10.0, help="seconds between rounds of page fetches"),
        arg("--var-dir", default="", help="GPUAAS_VAR_DIR for the demo (default: a new temporary folder)"),
        arg("--unkind", action="store_true", help="run the demo with `--unkind` (the simulator's real timings)"),
    ],
    targets=[
        correctness("rounds", ">=", 1),
        correctness("crashes", "==", 0),
        correctness("failed_requests", "==", 0),
        correctness("crosschecks", ">=", 1),
        correctness("contradictions", "==", 0),
        correctness("trespass_events", "==", 0),
    ],
    smoke=Smoke(skip="starts the whole demo (web, workers, beat, simulator) and soaks it for minutes"),
)
def demo_soak(*, minutes: float, interval: float, var_dir: str, unkind: bool = False, stdout) -> dict:
    out = stdout.write
    var = Path(var_dir) if var_dir else Path(tempfile.mkdtemp(prefix="gpuaas-soak-"))
    var.mkdir(parents=True, exist_ok=True)
    web_port, sim_port = _free_port(), _free_port()
    operator_pw, member_pw, metrics_token = (secrets.token_urlsafe(12) for _ in range(3))
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL"}}
    env.update(
        GPUAAS_VAR_DIR=str(var),
        GPUAAS_DEMO_OPERATOR_PASSWORD=operator_pw,
        GPUAAS_DEMO_MEMBER_PASSWORD=member_pw,
        MONITORING_METRICS_TOKEN=metrics_token,
    )
    (var / "logs").mkdir(exist_ok=True)
    celery_log = var / "logs" / "celery.log"
    log_offset = celery_log.stat().st_size if celery_log.exists() else 0
    tally = SoakTally(minutes=minutes)
    out(f"soak: demo in {var} (web 127.0.0.1:{web_port}, simulator {sim_port}); output in {var}/logs/demo.out")
    with open(var / "logs" / "demo.out", "ab") as demo_out:
        demo = subprocess.Popen(
            [
                sys.executable,
                str(Path(settings.BASE_DIR) / "manage.py"),
                "demo",
                "--web-port",
                str(web_port),
                "--sim-port",
                str(sim_port),
                "--oidc-port",
                str(_free_port()),
                *(["--unkind"] if unkind else []),
            ],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=demo_out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 600
        while not (_port_open(web_port) and (var / "demo-status.json").exists()):
            if demo.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the demo did not start (exit {demo.poll()}); see {var}/logs/demo.out")
            time.sleep(1)
        base = f"http://127.0.0.1:{web_port}"
        sessions = {
            "anon": requests.Session(),
            "operator": _login(base, "/admin/login/", "operator", operator_pw),
            "member": _login(base, "/accounts/login/", "member", member_pw),
        }
        op = sessions["operator"]
        response = op.post(
            base + "/api/v1/tokens/",
            json={"name": "demo-soak"},
            timeout=30,
            headers={"X-CSRFToken": op.cookies["csrftoken"], "Referer": base + "/api/v1/tokens/"},
        )
        response.raise_for_status()
        headers = {
            "token": {"Authorization": f"Bearer {response.json()['key']}"},
            "metrics": {"Authorization": f"Bearer {metrics_token}"},
        }
        out(f"soak: demo up, fetching {len(SOAK_PAGES)} pages every {interval:.0f} s for {minutes} minutes")
        end = time.monotonic() + minutes * 60
        while time.monotonic() < end:
            round_start = time.monotonic()
            tally.rounds += 1
            for name, who, path in SOAK_PAGES:
                session = sessions.get(who, sessions["anon"])
                try:
                    answer = session.get(base + path, headers=headers.get(who), timeout=30, allow_redirects=False)
                    tally.record(name, answer.status_code == 200, f"HTTP {answer.status_code}")
                except requests.RequestException as exc:
                    tally.record(name, False, type(exc).__name__)
            try:
                answer = sessions["operator"].get(base + CROSSCHECK_PATH, timeout=120, allow_redirects=False)
                tally.record("crosscheck", answer.status_code == 200, f"HTTP {answer.status_code}")
                if answer.status_code == 200:
                    tally.crosschecked(answer.json())
            except requests.RequestException as exc:
                tally.record("crosscheck", False, type(exc).__name__)
            status = json.loads((var / "demo-status.json").read_text())
            if status.get("crashes", 0) != tally.supervisor.get("crashes", 0):
                out(
                    f"soak: {time.strftime('%H:%M:%S')} supervisor counts {status['crashes']} crash(es), "
                    f"{status['restarts']} restart(s): {status['programs']}"
                )
            tally.supervisor = status
            if demo.poll() is not None:
                tally.demo_died, tally.demo_exit = True, demo.returncode
                out(f"soak: the demo itself exited with status {demo.returncode}; see {var}/logs/demo.out")
                break
            time.sleep(max(0.0, interval - (time.monotonic() - round_start)))
    finally:
        if demo.poll() is None:
            demo.send_signal(signal.SIGINT)  # what Ctrl-C sends: the demo stops its children itself
            try:
                tally.demo_exit = demo.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(demo.pid, signal.SIGKILL)
                tally.demo_exit = demo.wait()
                out("soak: the demo did not stop within 60 s of SIGINT and was killed")
    status_file = var / "demo-status.json"
    if status_file.exists():
        tally.supervisor = json.loads(status_file.read_text())
        left = [name for name, p in tally.supervisor["programs"].items() if p["alive"]]
        if left:
            out(f"soak: still running after the demo stopped: {left}")
    tally.tasks_processed = _count_tasks(celery_log, log_offset)
    tally.discovery_runs = _discovery_runs(var)
    tally.trespass_events = _trespass_events(var)
    result = tally.result() | {"unkind": unkind}
    for line in tally.first_failures:
        out(f"soak: failed {line}")
    for line in tally.first_contradictions:
        out(f"soak: contradiction {line}")
    out(
        f"soak: {result['rounds']} rounds, {result['requests']} requests, {result['failed_requests']} failed, "
        f"{result['crashes']} crash(es), {result['restarts']} restart(s), {result['tasks_processed']} tasks done, "
        f"{result['contradictions']} contradiction(s) in {result['crosschecks']} cross-checks; "
        f"demo stopped with status {tally.demo_exit}"
    )
    return result

"""`python manage.py demo` (what `make demo` runs): the whole platform on the embedded default.

Starts the simulated cluster, migrates, creates the demo logins, discovers the clusters, seeds a world
with something to see in every screen, then runs a Celery worker, beat, the ingest worker and the web
server (PROCESSES). Every process runs under supervisord (gpuaas.demo.processes): one that exits is logged and
restarted while the others keep running. Ctrl-C stops every process it started.
Running it again reuses var/ and changes nothing that exists.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from gpuaas.demo.env import SIM_OIDC_ISSUER, SIM_OIDC_PORT
from gpuaas.demo.processes import Program, Supervisord

WEB_ADDR = ("127.0.0.1", 8000)
SIM_PORT = 6443
BROKER_CLEANUP_S = 300
# `--unkind`: the simulator's real-cluster timings (docs/simcluster.md), which the default demo leaves at their kind
# values (docs/demo.md, "The simulator's knobs"): pods take 5 s to start and up to 10 s to terminate, a ConfigMap
# reaches the MIG manager's mounted copy 60 s after it changed (kubelet's sync), the device plugin keeps its
# devices until its pod restarts, and a MIG mode change passes through `rebooting`.
UNKIND_CONFIGMAP_SYNC_S = 60
UNKIND_SIM_ARGS = (
    "--pod-start-delay",
    "5",
    "--pod-termination-grace",
    "10",
    "--configmap-sync-delay",
    str(UNKIND_CONFIGMAP_SYNC_S),
    "--device-plugin-restart",
    "--mig-mode-reboot",
)


# Every process the demo supervises, as its start-up output names them (the key is the supervisor's name).
PROCESSES = {
    "simcluster": "the simulated cluster (Kubernetes API, GPU Operator, NVML)",
    "worker": "Celery worker: default, discovery, metrics, billing and every node's queue",
    "beat": "Celery beat: the periodic schedule",
    "ingest": "ingest worker (manage.py ingest-worker): writes the node agents' metric and inventory reports",
    "web": "web server",
}


def purge_delivered_messages(broker_url: str) -> int:
    """Delete the rows kombu's SQLAlchemy transport keeps for delivered messages (visible = 0).

    The transport marks a message invisible when a worker takes it and never deletes it; acknowledging
    is in the worker's memory only, so the rows are dead weight. Returns how many were deleted; a
    broker that is not an embedded SQLite file, or has no table yet, is left alone.
    """
    prefix = "sqla+sqlite:///"
    if not broker_url.startswith(prefix) or not Path(broker_url[len(prefix) :]).exists():
        return 0
    with sqlite3.connect(broker_url[len(prefix) :], timeout=30) as db:
        try:
            return db.execute("DELETE FROM kombu_message WHERE visible = 0").rowcount
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return 0
            raise


def _port_busy(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


class Command(BaseCommand):
    help = "Run the whole platform on the embedded default (SQLite, SQLite broker, simulated cluster)."

    def add_arguments(self, parser):
        parser.add_argument("--no-serve", action="store_true", help="Set up and seed, then exit (used by tests).")
        parser.add_argument("--sim-port", type=int, default=SIM_PORT)
        parser.add_argument("--web-port", type=int, default=WEB_ADDR[1])
        parser.add_argument(
            "--oidc-port",
            type=int,
            default=SIM_OIDC_PORT,
            help="port of the simulator's identity provider (company sign-in), while OIDC_ISSUER is the demo's own",
        )
        parser.add_argument(
            "--unkind",
            action="store_true",
            help="Run the simulator with its real-cluster timings (pod start/termination, ConfigMap sync, device "
            "plugin restart, MIG-mode reboot); see docs/demo.md.",
        )

    oidc_port: int | None = None  # the simulator's identity provider, when the demo serves one (handle)

    def handle(
        self,
        *args,
        no_serve=False,
        sim_port=SIM_PORT,
        web_port=WEB_ADDR[1],
        unkind=False,
        oidc_port=SIM_OIDC_PORT,
        **options,
    ):
        if _port_busy("127.0.0.1", web_port) and not no_serve:
            raise CommandError(f"port {web_port} is in use: stop the other server (an earlier `make demo`?) first")
        if _port_busy("127.0.0.1", sim_port):
            raise CommandError(f"port {sim_port} is in use: stop the other simulator first, or pass --sim-port")
        # The simulator's identity provider serves company sign-in while OIDC_ISSUER is the demo's default
        # (demo_environment); the processes started below inherit its URL on the chosen port.
        self.oidc_port = oidc_port if settings.OIDC_ISSUER == SIM_OIDC_ISSUER else None
        if self.oidc_port is not None:
            if _port_busy("127.0.0.1", oidc_port):
                raise CommandError(
                    f"port {oidc_port} (the simulated identity provider) is in use: stop the other demo first,"
                    " pass --oidc-port, or run with OIDC_ISSUER= (local passwords only)"
                )
            os.environ["OIDC_ISSUER"] = f"http://127.0.0.1:{oidc_port}"
        self.supervisor = Supervisord(
            settings.VAR_DIR / "supervisor",
            log=self._log,
            status_path=settings.VAR_DIR / "demo-status.json",
            cwd=Path(settings.BASE_DIR),
        )
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        # A shell without job control starts `cmd &` with SIGINT ignored; the soak bench stops us with it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if unkind:
            self._unkind_environment()
        try:
            self._run(no_serve, sim_port, web_port, UNKIND_SIM_ARGS if unkind else ())
        except KeyboardInterrupt:
            self.stdout.write("\nStopping…")
        finally:
            self.supervisor.stop()

    def _log(self, line: str) -> None:
        self.stdout.write(f"{time.strftime('%H:%M:%S')} {line}")

    def _program(self, name: str, *argv: str, log: str) -> Program:
        return self.supervisor.add(Program(name, [sys.executable, *argv], settings.VAR_DIR / "logs" / log))

    def _unkind_environment(self) -> None:
        """Give the worker a MIG_PARTED_SYNC_S that outlasts the simulated kubelet's ConfigMap sync.

        demo_environment() set 1 s for the kind simulator; with the 60 s sync the operator path would label
        the node before the mounted copy holds the new config. A value set in the environment that is long
        enough is kept; otherwise the production default (90 s) is used.
        """
        try:
            current = float(os.environ.get("MIG_PARTED_SYNC_S", "0"))
        except ValueError:
            current = 0.0
        if current < UNKIND_CONFIGMAP_SYNC_S:
            os.environ["MIG_PARTED_SYNC_S"] = "90"
        self._log(f"unkind simulator: {' '.join(UNKIND_SIM_ARGS)}; MIG_PARTED_SYNC_S={os.environ['MIG_PARTED_SYNC_S']}")

    def _run(self, no_serve: bool, sim_port: int, web_port: int, sim_args: tuple[str, ...] = ()) -> None:
        from gpuaas.demo import world as demo_world  # cycle: imports models; this module loads before apps

        out = self.stdout
        out.write("1/5 database: migrating")
        call_command("migrate", verbosity=0)
        self.supervisor.start()
        out.write(f"2/5 simulated cluster: starting on 127.0.0.1:{sim_port}")
        kube_dir = settings.VAR_DIR / "simcluster"
        self._program(
            "simcluster",
            "-m",
            "simcluster",
            "--scenario",
            "demo",
            "--port",
            str(sim_port),
            "--kubeconfig-dir",
            str(kube_dir),
            *sim_args,
            *(("--oidc-port", str(self.oidc_port)) if self.oidc_port is not None else ()),
            log="simcluster.log",
        )
        self._wait_for_port(sim_port, "simulator (see var/logs/simcluster.log)")
        out.write("3/5 clusters: registering and discovering")
        logins = demo_world.seed(kube_dir=Path(kube_dir), stdout=out)
        queues = ",".join(["default", "discovery", "metrics", "billing", *demo_world.node_queues()])
        if no_serve:
            return
        out.write("4/5 worker, beat and ingest worker: starting (logs in var/logs/)")
        self._program(
            "worker",
            "-m",
            "celery",
            "-A",
            "gpuaas",
            "worker",
            "-Q",
            queues,
            "--pool",
            "threads",
            "--concurrency",
            "4",
            "-l",
            "INFO",
            log="celery.log",
        )
        self._program(
            "beat",
            "-m",
            "celery",
            "-A",
            "gpuaas",
            "beat",
            "-l",
            "INFO",
            "--schedule",
            settings.CELERY_BEAT_SCHEDULE_FILENAME,
            log="beat.log",
        )
        # Node agents' reports (the worker above serves the simulated nodes' queues) are written by the ingest worker.
        self._program("ingest", "manage.py", "ingest-worker", log="ingest.log")
        out.write("5/5 web server: starting")
        self._program("web", "manage.py", "runserver", f"127.0.0.1:{web_port}", "--noreload", log="web.log")
        self._wait_for_port(web_port, "web server (see var/logs/web.log)")
        base = f"http://127.0.0.1:{web_port}"
        out.write(self.style.SUCCESS("\ngpuaas is running.\n"))
        out.write(f"  Sign in:            {base}/accounts/login/   (operators land on the dashboard)")
        out.write(f"  Operator console:   {base}/admin/            login {logins['operator']}")
        out.write(f"  Project view:       {base}/projects/         login {logins['member']}")
        if self.oidc_port is not None:
            out.write(
                f'  Company sign-in:    {base}/accounts/login/   "Sign in with the simulated identity provider":'
                " ada (operator), grace (vision member), linus (no group)"
            )
        out.write(f"  API docs:           {base}/api/docs/")
        out.write(f"  Kubeconfigs:        {kube_dir}/")
        out.write("\nProcesses (logs in var/logs/):")
        for name in self.supervisor.programs:
            out.write(f"  {name + ':':<12} {PROCESSES[name]}")
        out.write("\nA process that stops is restarted. Ctrl-C stops them all.")
        next_cleanup = time.monotonic() + BROKER_CLEANUP_S

        def housekeeping() -> None:
            nonlocal next_cleanup
            if time.monotonic() >= next_cleanup:
                next_cleanup = time.monotonic() + BROKER_CLEANUP_S
                try:
                    purge_delivered_messages(settings.CELERY_BROKER_URL)
                except sqlite3.Error as exc:  # the next pass tries again; never stop the demo for this
                    self._log(f"broker cleanup skipped: {exc}")

        self.supervisor.run(every_tick=housekeeping)

    def _wait_for_port(self, port: int, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _port_busy("127.0.0.1", port):
                return
            self.supervisor.poll()
            if not all(self.supervisor.alive(name) for name in self.supervisor.programs):
                break
            time.sleep(0.2)
        raise CommandError(f"{what} did not start")

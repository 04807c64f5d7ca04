"""`python manage.py demo` (what `make demo` runs): the whole platform on the embedded default.

Starts the simulated cluster, migrates, creates the demo logins, discovers the clusters, seeds a world
with something to see in every screen, then runs the web server and a Celery worker with beat. Ctrl-C
stops every process it started. Running it again reuses var/ and changes nothing that exists.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

WEB_ADDR = ("127.0.0.1", 8000)
SIM_PORT = 6443


def _port_busy(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


class Command(BaseCommand):
    help = "Run the whole platform on the embedded default (SQLite, filesystem broker, simulated cluster)."

    def add_arguments(self, parser):
        parser.add_argument("--no-serve", action="store_true", help="Set up and seed, then exit (used by tests).")
        parser.add_argument("--sim-port", type=int, default=SIM_PORT)
        parser.add_argument("--web-port", type=int, default=WEB_ADDR[1])

    def handle(self, *args, no_serve=False, sim_port=SIM_PORT, web_port=WEB_ADDR[1], **options):
        self.children: list[subprocess.Popen] = []
        if _port_busy("127.0.0.1", web_port) and not no_serve:
            raise CommandError(f"port {web_port} is in use: stop the other server (an earlier `make demo`?) first")
        if _port_busy("127.0.0.1", sim_port):
            raise CommandError(f"port {sim_port} is in use: stop the other simulator first, or pass --sim-port")
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        try:
            self._run(no_serve, sim_port, web_port)
        except KeyboardInterrupt:
            self.stdout.write("\nStopping…")
        finally:
            self._stop_children()

    def _spawn(self, *argv: str, log: str) -> subprocess.Popen:
        log_path = settings.VAR_DIR / "logs" / log
        log_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(log_path, "ab")  # noqa: SIM115 - lives as long as the child
        proc = subprocess.Popen(
            [sys.executable, *argv], stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.children.append(proc)
        return proc

    def _stop_children(self) -> None:
        for proc in reversed(self.children):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.children:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    def _run(self, no_serve: bool, sim_port: int, web_port: int) -> None:
        from gpuaas import demo_world

        out = self.stdout
        out.write("1/5 database: migrating")
        call_command("migrate", verbosity=0)
        out.write(f"2/5 simulated cluster: starting on 127.0.0.1:{sim_port}")
        kube_dir = settings.VAR_DIR / "simcluster"
        self._spawn("-m", "simcluster", "--scenario", "demo", "--port", str(sim_port),
                    "--kubeconfig-dir", str(kube_dir), log="simcluster.log")
        self._wait_for_port(sim_port, "simulator (see var/logs/simcluster.log)")
        out.write("3/5 clusters: registering and discovering")
        logins = demo_world.seed(kube_dir=Path(kube_dir), stdout=out)
        queues = ",".join(["default", "discovery", "metrics", "billing", *demo_world.node_queues()])
        if no_serve:
            return
        out.write("4/5 worker and beat: starting (logs in var/logs/)")
        self._spawn("-m", "celery", "-A", "gpuaas", "worker", "-B", "-Q", queues, "--pool", "threads",
                    "--concurrency", "4", "-l", "INFO", "--schedule", settings.CELERY_BEAT_SCHEDULE_FILENAME,
                    log="celery.log")
        out.write("5/5 web server: starting")
        self._spawn("manage.py", "runserver", f"127.0.0.1:{web_port}", "--noreload", log="web.log")
        self._wait_for_port(web_port, "web server (see var/logs/web.log)")
        base = f"http://127.0.0.1:{web_port}"
        out.write(self.style.SUCCESS("\ngpuaas is running.\n"))
        out.write(f"  Sign in:            {base}/accounts/login/   (operators land on the dashboard)")
        out.write(f"  Operator console:   {base}/admin/            login {logins['operator']}")
        out.write(f"  Project view:       {base}/projects/         login {logins['member']}")
        out.write(f"  API docs:           {base}/api/docs/")
        out.write(f"  Kubeconfigs:        {kube_dir}/")
        out.write("\nCtrl-C stops the web server, the worker, beat and the simulator.")
        while all(proc.poll() is None for proc in self.children):
            time.sleep(1)
        dead = [" ".join(map(str, proc.args[1:3])) for proc in self.children if proc.poll() is not None]
        raise CommandError(f"a demo process stopped unexpectedly: {dead}; see var/logs/")

    def _wait_for_port(self, port: int, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _port_busy("127.0.0.1", port):
                return
            if any(proc.poll() is not None for proc in self.children):
                break
            time.sleep(0.2)
        raise CommandError(f"{what} did not start")

"""`python manage.py simcluster --scenario demo --port 6443 [--kubeconfig-dir var/simcluster] [--register]`.

A development tool: runs the simulated clusters (simcluster.main) in this process until Ctrl-C, and with
--register points a Cluster row per simulated cluster at the kubeconfig it wrote. The apps never import
simcluster (an import-linter contract, pyproject.toml); this command, in the top `gpuaas` layer with the
demo and the benchmarks, may, as it only exists to drive it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from capacity.services.clusters import register_cluster
from simcluster import load_scenario, main
from simcluster.runner import build_parser

STARTUP_TIMEOUT_S = 300.0


def serve(argv: list[str], *, register: bool, stop: threading.Event, write=print) -> int:
    """Run simcluster.main(argv) until `stop` is set; with register, register its clusters once they are served."""
    parsed = build_parser().parse_args(argv)
    names = [c.name for c in load_scenario(parsed.scenario, **dict(parsed.param)).clusters]
    paths = {name: Path(parsed.kubeconfig_dir) / f"{name}.kubeconfig" for name in names}
    for path in paths.values():
        path.unlink(missing_ok=True)  # so a file that exists below is one this run wrote
    outcome: dict[str, int] = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("rc", main(argv, stop=stop)), daemon=True)
    thread.start()
    if register:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not all(p.exists() for p in paths.values()):
            if not thread.is_alive() or time.monotonic() > deadline:
                stop.set()
                thread.join()
                return outcome.get("rc", 1)
            time.sleep(0.1)
        for name, path in paths.items():
            cluster, created = register_cluster(name, path)
            write(f"{'registered' if created else 'updated'} cluster {cluster.name} -> {path}")
    try:
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        stop.set()
        thread.join()
    return outcome.get("rc", 0)


class Command(BaseCommand):
    help = "Run the simulated GPU clusters (development); --register points Cluster rows at their kubeconfigs."

    def add_arguments(self, parser):
        parser.add_argument("--scenario", default="demo", help="demo, scale, or a scenario YAML path")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=6443)
        parser.add_argument("--kubeconfig-dir", default="var/simcluster")
        parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="e.g. nodes=200")
        parser.add_argument("--tick", type=float, default=1.0, help="seconds between metric ticks (0: frozen)")
        parser.add_argument("--register", action="store_true", help="create/update a Cluster row per cluster")

    def handle(self, *args, scenario, host, port, kubeconfig_dir, param, tick, register, **options):
        argv = ["--scenario", scenario, "--host", host, "--port", str(port), "--kubeconfig-dir", kubeconfig_dir]
        argv += ["--tick", str(tick)]
        for item in param:
            argv += ["--param", item]
        rc = serve(argv, register=register, stop=threading.Event(), write=self.stdout.write)
        if rc:
            raise CommandError(f"simcluster exited with status {rc}")

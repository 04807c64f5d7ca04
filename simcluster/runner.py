"""`python -m simcluster`: build a scenario, serve it, write kubeconfigs, tick metrics.

    python -m simcluster --scenario demo --port 6443 --kubeconfig-dir var/simcluster
    python -m simcluster --scenario scale --param nodes=500 --param gpus_per_node=4

`main(argv)` is what a Django management command wraps.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from .apiserver import SimServer
from .oidc import DEMO_CLIENT, OidcProvider
from .scenarios import ScenarioError, available_scenarios, load_scenario
from .state import SimState


def _param(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    for cast in (int, float):
        try:
            return key, cast(value)
        except ValueError:
            pass
    return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="simcluster", description="Simulated Kubernetes GPU clusters for gpuaas.")
    parser.add_argument(
        "--scenario",
        default="demo",
        help=f"built-in ({', '.join(available_scenarios())}) or a YAML path (default: demo)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6443)
    parser.add_argument("--kubeconfig-dir", default="var/simcluster")
    parser.add_argument(
        "--param",
        action="append",
        type=_param,
        default=[],
        metavar="KEY=VALUE",
        help="scenario parameter, e.g. nodes=200 (repeatable)",
    )
    parser.add_argument("--seed", type=int, help="override the scenario's seed")
    parser.add_argument("--token", help="require this bearer token (default: accept any)")
    parser.add_argument("--tick", type=float, default=1.0, help="seconds between metric ticks (0: frozen)")
    parser.add_argument("--mig-manager-delay", type=float, default=0.2)
    parser.add_argument(
        "--pod-start-delay",
        type=float,
        default=0.0,
        help="seconds a bound pod stays ContainerCreating (default 0: Running at once)",
    )
    parser.add_argument(
        "--pod-termination-grace",
        type=float,
        default=0.0,
        help="longest a deleted pod stays Terminating (default 0: gone at once)",
    )
    parser.add_argument(
        "--configmap-sync-delay",
        type=float,
        default=0.0,
        help="seconds before a ConfigMap change reaches the MIG manager's mounted copy (real: ~60)",
    )
    parser.add_argument(
        "--device-plugin-restart",
        action="store_true",
        help="the device plugin keeps its devices after NVML MIG writes until its pod restarts",
    )
    parser.add_argument(
        "--mig-mode-reboot",
        action="store_true",
        help="the MIG manager passes through `rebooting` to change a GPU's MIG mode",
    )
    parser.add_argument(
        "--oidc-port",
        type=int,
        help="also serve the simulated OpenID Connect provider (simcluster/oidc.py) on this port (0: any free one)",
    )
    parser.add_argument("--verbose", action="store_true", help="log every request")
    return parser


def main(argv: list[str] | None = None, *, stop: threading.Event | None = None) -> int:
    """Run until SIGINT/SIGTERM (or until `stop` is set, for embedding and tests)."""
    args = build_parser().parse_args(argv)
    started = time.monotonic()
    try:
        scenario = load_scenario(args.scenario, **dict(args.param))
    except ScenarioError as exc:
        print(f"simcluster: {exc}", file=sys.stderr)
        return 2
    if args.seed is not None:
        scenario.seed = args.seed
    state = scenario.build(
        SimState(
            seed=scenario.seed,
            mig_manager_delay=args.mig_manager_delay,
            configmap_sync_delay=args.configmap_sync_delay,
            device_plugin_restart=args.device_plugin_restart,
            mig_mode_reboot=args.mig_mode_reboot,
        )
    )
    state.api.pod_start_delay_s = args.pod_start_delay
    state.api.pod_termination_grace_s = args.pod_termination_grace
    server = SimServer(
        state, host=args.host, port=args.port, token=args.token, tick_interval=args.tick or None, verbose=args.verbose
    )
    try:
        server.start()
    except OSError as exc:
        print(f"simcluster: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    provider = None
    if args.oidc_port is not None:
        try:
            provider = OidcProvider(host=args.host, port=args.oidc_port).start()
        except OSError as exc:
            server.stop()
            print(f"simcluster: cannot listen on {args.host}:{args.oidc_port} (OIDC provider): {exc}", file=sys.stderr)
            return 1
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    paths = server.write_kubeconfigs(args.kubeconfig_dir)
    counts = scenario.expected_counts()["clusters"]
    print(
        f"simcluster: scenario {scenario.name!r} (seed {scenario.seed}) built in "
        f"{time.monotonic() - started:.1f}s, serving {server.url}",
        flush=True,
    )
    for name, path in paths.items():
        print(
            f"  cluster {name}: {counts[name]['nodes']} nodes, {sum(counts[name]['gpus'].values())} GPUs, "
            f"{server.cluster_url(name)}  kubeconfig {path}",
            flush=True,
        )
    if provider is not None:
        people = ", ".join(sorted(provider.people))
        print(f"  OIDC provider {provider.issuer} (client {DEMO_CLIENT.client_id}; people: {people})", flush=True)
    try:
        stop.wait()
    finally:
        server.stop()
        if provider is not None:
            provider.stop()
    return 0

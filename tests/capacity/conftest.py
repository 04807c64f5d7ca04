"""Fixtures of the capacity tests.

Discovery: `simcluster` starts in-process simulator servers (stopped after the test) and registers
their clusters; `retry_waits` makes the Kubernetes adapter's retries instant and records each wait.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest


@dataclass
class SimHandle:
    """A running simulator: its state (faults, MIG manager), server, kubeconfigs and Cluster rows."""

    state: object
    server: object
    kubeconfigs: dict[str, Path]
    scenario: object
    clusters: dict[str, object] = field(default_factory=dict)

    @property
    def faults(self):
        return self.state.faults

    def url(self, cluster: str) -> str:
        return self.server.cluster_url(cluster)

    def register(self, *names: str, prefix: str = "") -> dict[str, object]:
        """Cluster rows (named prefix + name) for these simulated clusters (all of them by default)."""
        from capacity.models import Cluster

        for name in names or tuple(self.kubeconfigs):
            self.clusters[name], _ = Cluster.objects.get_or_create(
                name=prefix + name, defaults={"kubeconfig_path": str(self.kubeconfigs[name])}
            )
        return self.clusters

    def expected(self, cluster: str) -> dict:
        return self.scenario.expected_counts()["clusters"][cluster]


@pytest.fixture
def simcluster(tmp_path):
    """simcluster(scenario="demo", **params) -> SimHandle; the MIG manager only runs when asked."""
    from simcluster import SimServer, load_scenario

    servers = []

    def start(scenario: str = "demo", **params) -> SimHandle:
        loaded = load_scenario(scenario, **params)
        state = loaded.build(mig_manager_delay=3600)
        server = SimServer(state).start()
        servers.append(server)
        kubeconfigs = server.write_kubeconfigs(tmp_path / f"kube-{len(servers)}")
        return SimHandle(state, server, kubeconfigs, loaded)

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def retry_waits(monkeypatch):
    """The Kubernetes adapter's retry waits, recorded instead of slept."""
    from capacity.adapters.kubernetes import transport

    waits: list[float] = []
    monkeypatch.setattr(transport, "backoff_sleep", waits.append)
    return waits

"""Fixtures for the simulator's own tests: no Django, no database.

Each test gets a freshly built `demo` scenario (about 0.1 s) served by an in-process
SimServer, and official-client CoreV1Api objects built from the kubeconfigs it writes.
"""

from __future__ import annotations

import pytest
from kubernetes import client, config

from simcluster import SimServer, load_scenario


@pytest.fixture
def demo():
    return load_scenario("demo")


@pytest.fixture
def state(demo):
    return demo.build(mig_manager_delay=0.2)


@pytest.fixture
def server(state):
    with SimServer(state) as srv:
        yield srv


@pytest.fixture
def kubeconfigs(server, tmp_path):
    return server.write_kubeconfigs(tmp_path / "kube")


def core_api(path, *, retries: bool | None = False) -> client.CoreV1Api:
    """A client of its own for one kubeconfig.

    urllib3 retries are off by default (as in capacity.adapters.kubernetes) so every fault
    reaches the caller; retries=None keeps urllib3's default, which silently retries GET
    timeouts and 429/503 answers that carry Retry-After.
    """
    cfg = type.__call__(client.Configuration)  # not a copy of the process-wide default
    config.load_kube_config(config_file=str(path), client_configuration=cfg, persist_config=False)
    cfg.retries = retries
    return client.CoreV1Api(client.ApiClient(cfg))


@pytest.fixture
def make_api():
    """Build a CoreV1Api from a kubeconfig path."""
    return core_api


@pytest.fixture
def prod(kubeconfigs) -> client.CoreV1Api:
    return core_api(kubeconfigs["prod"])


@pytest.fixture
def dev(kubeconfigs) -> client.CoreV1Api:
    return core_api(kubeconfigs["dev"])

"""Fault knobs, through the Python API and POST /sim/v1/faults, seen by the official client."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException


def post(url: str, body: dict | None = None, method: str = "POST") -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read())


def test_500_for_the_next_n_calls(prod, state):
    state.faults.api_error(2, status=500)
    for _ in range(2):
        with pytest.raises(ApiException) as exc:
            prod.list_node()
        assert exc.value.status == 500
        assert json.loads(exc.value.body)["reason"] == "InternalError"
    assert len(prod.list_node().items) == 6


def test_429_with_retry_after_only_on_a_path_prefix(prod, state):
    state.faults.api_error(1, status=429, retry_after=3, path_prefix="/api/v1/pods")
    assert prod.list_node().items  # other paths unaffected
    with pytest.raises(ApiException) as exc:
        prod.list_pod_for_all_namespaces()
    assert exc.value.status == 429
    assert exc.value.headers["Retry-After"] == "3"
    assert json.loads(exc.value.body)["details"] == {"retryAfterSeconds": 3}
    assert prod.list_pod_for_all_namespaces().items


def test_urllib3_default_retries_absorb_a_429_with_retry_after(kubeconfigs, make_api, state):
    patient = make_api(kubeconfigs["prod"], retries=None)
    state.faults.api_error(1, status=429, retry_after=0)
    assert patient.list_node().items  # urllib3 honoured Retry-After and retried on its own
    assert state.faults.api_faults() == []


def test_faults_are_per_cluster(prod, dev, state):
    state.faults.api_error(1, status=503, cluster="dev")
    assert prod.list_node().items
    with pytest.raises(ApiException) as exc:
        dev.list_node()
    assert exc.value.status == 503


def test_timeout(prod, state):
    state.faults.api_timeout(10, seconds=2.0, path_prefix="/api/v1/nodes")
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        prod.list_node(_request_timeout=0.2)
    assert time.monotonic() - started < 1.0
    state.faults.reset()
    assert prod.list_node(_request_timeout=5).items


def test_mid_pagination_500_and_410(prod, state):
    first = prod.list_node(limit=2)
    state.faults.api_page_error(page=2, status=500, path_prefix="/api/v1/nodes")
    with pytest.raises(ApiException) as exc:
        prod.list_node(limit=2, _continue=first.metadata._continue)
    assert exc.value.status == 500
    second = prod.list_node(limit=2, _continue=first.metadata._continue)
    assert [n.metadata.name for n in second.items] == ["prod-h100-bal-01", "prod-h100-bal-02"]

    state.faults.api_page_error(page=3, status=410)
    with pytest.raises(ApiException) as exc:
        prod.list_node(limit=2, _continue=second.metadata._continue)
    assert exc.value.status == 410
    body = json.loads(exc.value.body)
    assert body["reason"] == "Expired" and body["metadata"]["continue"]
    assert "too old to display a consistent list result" in body["message"]


def test_node_vanishes_and_comes_back(prod, state):
    state.faults.node_vanish("prod", "prod-h100-full-01")
    assert "prod-h100-full-01" not in [n.metadata.name for n in prod.list_node().items]
    with pytest.raises(ApiException) as exc:
        prod.read_node("prod-h100-full-01")
    assert exc.value.status == 404
    assert prod.list_pod_for_all_namespaces(field_selector="spec.nodeName=prod-h100-full-01").items == []
    state.faults.reset()
    assert prod.read_node("prod-h100-full-01").metadata.name == "prod-h100-full-01"


def test_node_not_ready(prod, state):
    state.faults.node_ready("prod", "prod-h100-full-02", ready=False)
    ready = [c for c in prod.read_node("prod-h100-full-02").status.conditions if c.type == "Ready"][0]
    assert (ready.status, ready.reason) == ("Unknown", "NodeStatusUnknown")


def test_faults_over_http(server, prod):
    base = server.cluster_url("prod")
    armed = post(f"{base}/sim/v1/faults", {"fault": "api_error", "count": 1, "status": 500})
    assert armed["remaining"] == 1
    assert post(f"{base}/sim/v1/faults", method="GET") == {"api": [armed]}
    with pytest.raises(ApiException):
        prod.list_node()
    post(f"{base}/sim/v1/faults", {"fault": "gpu_lost", "node": "prod-h100-full-02", "gpu": 0})
    assert prod.read_node("prod-h100-full-02").status.allocatable["nvidia.com/gpu"] == "7"
    post(f"{base}/sim/v1/faults", {"fault": "xid", "node": "prod-h100-full-02", "gpu": 1, "code": 94})
    post(f"{base}/sim/v1/faults", method="DELETE")
    assert prod.read_node("prod-h100-full-02").status.allocatable["nvidia.com/gpu"] == "8"
    with pytest.raises(urllib.error.HTTPError) as exc:
        post(f"{base}/sim/v1/faults", {"fault": "meteor_strike"})
    assert exc.value.code == 400


def test_tick_and_info_endpoints(server, state):
    base = server.cluster_url("prod")
    assert post(f"{base}/sim/v1/tick", {"seconds": 30})["time"] == 30.0
    info = post(f"{base}/sim/v1/info", method="GET")
    assert info["scenario"] == "demo"
    assert info["clusters"]["prod"]["nodes"] == 6 and info["clusters"]["dev"]["gpus"] == 16
    node = post(f"{base}/sim/v1/nodes/prod-h100-bal-01", method="GET")
    assert node["mig_strategy"] == "mixed" and len(node["devices"]["nvidia.com/mig-1g.10gb"]) == 16


def test_a_failed_write_leaves_the_keep_alive_connection_usable(prod, state):
    state.faults.api_error(1, status=500, method="POST")
    body = {"metadata": {"name": "cfg"}, "data": {"k": "v" * 10000}}
    with pytest.raises(ApiException):
        prod.create_namespaced_config_map("team-nlp", body)
    assert prod.create_namespaced_config_map("team-nlp", body).metadata.name == "cfg"
    assert prod.list_node().items


def test_a_trespass_pod_takes_a_free_unit_and_nvml_shows_its_process(server, prod, state):
    """`trespass`: a pod no pool reserved takes one free device of the node, seen by the official client
    and by NVML; a node with nothing free of that resource refuses the fault (400) rather than leave it Pending."""
    from simcluster import scheduler

    base = server.cluster_url("prod")
    made = post(f"{base}/sim/v1/faults", {"fault": "trespass", "node": "prod-h100-full-02", "pod": "miner"})
    assert made["pod"] == "intruder/miner" and made["node"] == "prod-h100-full-02" and len(made["devices"]) == 1
    pod = prod.read_namespaced_pod("miner", "intruder")
    assert (pod.spec.node_name, pod.status.phase) == ("prod-h100-full-02", "Running")
    cluster = state.cluster("prod")
    node = cluster.nodes["prod-h100-full-02"]
    uuids = {g.uuid: g.index for g in node.gpus}
    (process,) = [p for p in scheduler.processes(cluster, node) if p["pod"] == "intruder/miner"]
    assert process["gpu"] == uuids[made["devices"][0]] and process["used_bytes"] > 0
    for _ in range(7):  # the node's 8 GPUs, one already taken
        state.faults.trespass("prod", "prod-h100-full-02")
    with pytest.raises(urllib.error.HTTPError) as exc:
        post(f"{base}/sim/v1/faults", {"fault": "trespass", "node": "prod-h100-full-02"})
    assert exc.value.code == 400 and "no free nvidia.com/gpu device" in json.loads(exc.value.read())["message"]

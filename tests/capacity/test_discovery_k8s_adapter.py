"""The Kubernetes adapter against the simulator: paging, retries, every API fault knob, write calls, errors."""

import kubernetes
import pytest

from capacity.adapters import kubernetes as kube

PROD_NODES = [
    "prod-h100-4g3g-01",
    "prod-h100-4g3g-02",
    "prod-h100-bal-01",
    "prod-h100-bal-02",
    "prod-h100-full-01",
    "prod-h100-full-02",
]


@pytest.fixture
def sim(simcluster):
    return simcluster("demo")


def client(sim, cluster="prod", **kwargs) -> kube.KubernetesClient:
    kwargs.setdefault("retries", 3)
    return kube.KubernetesClient.from_kubeconfig(str(sim.kubeconfigs[cluster]), **kwargs)


def test_lists_are_paged_and_complete(sim, retry_waits):
    with client(sim, page_size=2) as k:
        assert [n.name for n in k.list_nodes()] == PROD_NODES
        pods = k.list_pods()
    assert sorted(p.name for p in pods) == ["detector", "llm-train-0", "llm-train-1", "segmenter", "tracker"]
    assert retry_waits == []


def test_500_is_retried_with_backoff_then_succeeds(sim, retry_waits):
    sim.faults.api_error(2, status=500, path_prefix="/api/v1/nodes")
    with client(sim) as k:
        assert len(k.list_nodes()) == 6
    assert len(retry_waits) == 2
    assert 0 < retry_waits[0] <= kube.BACKOFF_BASE_S < retry_waits[1] <= 2 * kube.BACKOFF_BASE_S


def test_500_beyond_the_retries_raises_unavailable(sim, retry_waits):
    sim.faults.api_error(5, status=500, path_prefix="/api/v1/nodes")
    with client(sim, retries=2) as k, pytest.raises(kube.Unavailable) as err:
        k.list_nodes()
    assert err.value.status == 500
    assert "simulated fault" in str(err.value)
    assert len(retry_waits) == 2


def test_429_waits_as_long_as_retry_after_says(sim, retry_waits):
    sim.faults.api_error(1, status=429, retry_after=3, path_prefix="/api/v1/nodes")
    with client(sim) as k:
        assert len(k.list_nodes()) == 6
    assert retry_waits == [3.0]


def test_503_with_retry_after_is_retried(sim, retry_waits):
    sim.faults.api_error(1, status=503, retry_after=2, path_prefix="/api/v1/pods")
    with client(sim) as k:
        assert len(k.list_pods()) == 5
    assert retry_waits == [2.0]


def test_a_timeout_is_retried(sim, retry_waits):
    sim.faults.api_timeout(1, seconds=1.0, path_prefix="/api/v1/nodes")
    with client(sim, timeout_s=0.3) as k:
        assert len(k.list_nodes()) == 6
    assert len(retry_waits) == 1


def test_timeouts_beyond_the_retries_raise_unavailable(sim, retry_waits):
    sim.faults.api_timeout(2, seconds=1.0, path_prefix="/api/v1/nodes")
    with client(sim, timeout_s=0.3, retries=1) as k, pytest.raises(kube.Unavailable) as err:
        k.list_nodes()
    assert "timed out" in str(err.value)
    assert err.value.status is None


def test_an_unreachable_server_is_unavailable(sim, retry_waits):
    sim.server.stop()
    with client(sim, retries=1) as k, pytest.raises(kube.Unavailable, match="connection failed"):
        k.list_nodes()
    assert len(retry_waits) == 1


def test_a_page_that_keeps_failing_fails_the_whole_list(sim, retry_waits):
    sim.faults.api_page_error(page=2, status=500, path_prefix="/api/v1/nodes", count=10)
    with client(sim, page_size=2, retries=2) as k, pytest.raises(kube.Unavailable):
        k.list_nodes()
    assert len(retry_waits) == 2


def test_a_page_that_fails_once_is_retried_and_the_list_is_complete(sim, retry_waits):
    sim.faults.api_page_error(page=2, status=500, path_prefix="/api/v1/nodes", count=1)
    with client(sim, page_size=2) as k:
        assert [n.name for n in k.list_nodes()] == PROD_NODES
    assert len(retry_waits) == 1


def test_an_expired_continue_token_restarts_the_list_once(sim, retry_waits):
    sim.faults.api_page_error(page=2, status=410, path_prefix="/api/v1/nodes", count=1)
    with client(sim, page_size=2) as k:
        assert [n.name for n in k.list_nodes()] == PROD_NODES
    assert retry_waits == []


def test_a_second_expired_token_is_an_error(sim, retry_waits):
    sim.faults.api_page_error(page=2, status=410, path_prefix="/api/v1/nodes", count=2)
    with client(sim, page_size=2) as k, pytest.raises(kube.Expired):
        k.list_nodes()


def test_errors_are_adapter_exceptions_never_the_clients(sim, retry_waits):
    with client(sim) as k:
        with pytest.raises(kube.NotFound) as missing:
            k.get_node("no-such-node")
        k.create_config_map("default", "cm", {"a": "1"})
        with pytest.raises(kube.Conflict):
            k.create_config_map("default", "cm", {"a": "2"})
        stale = k.get_config_map("default", "cm")["metadata"]["resourceVersion"]
        k.replace_config_map("default", "cm", {"a": "3"})
        with pytest.raises(kube.Conflict):
            k.replace_config_map("default", "cm", {"a": "4"}, resource_version=stale)
        with pytest.raises(kube.Invalid):
            k.create_resource_quota("default", "q", {"requests.nvidia.com/gpu": "not-a-quantity"})
    assert missing.value.status == 404
    assert not isinstance(missing.value, kubernetes.client.exceptions.ApiException)
    assert retry_waits == []


def test_node_writes_labels_annotations_cordon(sim, retry_waits):
    node = "prod-h100-full-01"
    with client(sim) as k:
        k.patch_node_labels(node, {"gpuaas.io/pool-7": "true", "gpuaas.io/tier": None})
        k.patch_node_annotations(node, {"gpuaas.io/note": "maintenance"})
        assert k.cordon(node).unschedulable is True
        got = k.get_node(node)
        assert (got.labels.get("gpuaas.io/pool-7"), "gpuaas.io/tier" in got.labels) == ("true", False)
        assert got.annotations["gpuaas.io/note"] == "maintenance"
        assert k.uncordon(node).unschedulable is False


def test_pod_listing_eviction_and_deletion(sim, retry_waits):
    with client(sim) as k:
        on_node = {p.name for p in k.list_pods_on_node("prod-h100-full-01")}
        assert on_node == {"llm-train-0", "llm-train-1"}
        assert [p.name for p in k.list_pods("team-vision", label_selector="app=tracker")] == ["tracker"]
        k.evict_pod("team-nlp", "llm-train-0")
        k.delete_pod("team-vision", "tracker")
        assert sorted(p.name for p in k.list_pods()) == ["detector", "llm-train-1", "segmenter"]
        with pytest.raises(kube.NotFound):
            k.delete_pod("team-vision", "tracker")


def test_an_eviction_blocked_by_a_budget_is_not_retried(sim, retry_waits):
    sim.faults.api_error(1, status=429, path_prefix="/api/v1/namespaces/team-nlp/pods/llm-train-0/eviction")
    with client(sim) as k, pytest.raises(kube.TooManyRequests):
        k.evict_pod("team-nlp", "llm-train-0")
    assert retry_waits == []


def test_configmap_quota_and_namespace_writes(sim, retry_waits):
    with client(sim) as k:
        k.apply_config_map("gpu-operator", "gpuaas-cm", {"config.yaml": "a"}, labels={"app": "gpuaas"})
        k.apply_config_map("gpu-operator", "gpuaas-cm", {"config.yaml": "b"})
        k.patch_config_map("gpu-operator", "gpuaas-cm", data={"extra": "x"}, annotations={"note": "y"})
        cm = k.get_config_map("gpu-operator", "gpuaas-cm")
        assert cm["data"] == {"config.yaml": "b", "extra": "x"}
        assert cm["metadata"]["annotations"] == {"note": "y"}

        k.ensure_namespace("team-x", labels={"gpuaas.io/project": "x"}, node_selector="gpuaas.io/pool-1=true")
        k.ensure_namespace("team-x", labels={"extra": "1"})
        ns = k.get_namespace("team-x")
        assert ns["metadata"]["labels"] == {
            "gpuaas.io/project": "x",
            "extra": "1",
            "kubernetes.io/metadata.name": "team-x",
        }
        assert ns["metadata"]["annotations"][kube.NODE_SELECTOR_ANNOTATION] == "gpuaas.io/pool-1=true"

        k.apply_resource_quota("team-x", "gpu", {"requests.nvidia.com/gpu": "4"})
        k.apply_resource_quota("team-x", "gpu", {"requests.nvidia.com/gpu": "2"})
        assert k.get_resource_quota("team-x", "gpu")["spec"]["hard"] == {"requests.nvidia.com/gpu": "2"}
        k.delete_resource_quota("team-x", "gpu")
        with pytest.raises(kube.NotFound):
            k.get_resource_quota("team-x", "gpu")


def test_each_cluster_has_its_own_configuration_and_the_global_default_is_untouched(sim, db):
    from capacity.models import Cluster

    before = kubernetes.client.Configuration.get_default_copy().host
    text = sim.kubeconfigs["dev"].read_text()
    dev = Cluster(name="dev")
    dev.set_kubeconfig(text)  # stored encrypted, no file path
    dev.save()
    prod = Cluster.objects.create(name="prod", kubeconfig_path=str(sim.kubeconfigs["prod"]))
    with kube.KubernetesClient.for_cluster(prod) as p, kube.KubernetesClient.for_cluster(dev) as d:
        assert (p.host, d.host) == (sim.url("prod"), sim.url("dev"))
        assert (len(p.list_nodes()), len(d.list_nodes())) == (6, 2)
    assert kubernetes.client.Configuration.get_default_copy().host == before


def test_unreadable_kubeconfigs_are_config_errors(tmp_path, sim):
    with pytest.raises(kube.ConfigError, match="does not exist"):
        kube.load_configuration(kubeconfig_path=str(tmp_path / "missing"))
    bad = tmp_path / "bad"
    bad.write_text("clusters: [")
    with pytest.raises(kube.ConfigError):
        kube.load_configuration(kubeconfig_path=str(bad))
    with pytest.raises(kube.ConfigError):
        kube.load_configuration(kubeconfig_path=str(sim.kubeconfigs["prod"]), context="nope")
    with pytest.raises(kube.ConfigError, match="not a YAML mapping"):
        kube.load_configuration(kubeconfig_text="just text")

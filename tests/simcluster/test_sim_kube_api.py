"""The fake kube-apiserver as the official client sees a real one (#14 item 5): discovery,
watch (bookmarks, 410 Gone), list resourceVersion and consistent continue pages, strategic
merge patch, and pod phases over time (Pending/ContainerCreating -> Running, Terminating)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from simcluster import kube

NS = "team-vision"


def _pod(name: str, image: str = "busybox:1.36", **resources) -> dict:
    return {
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "env": [{"name": "A", "value": "1"}],
                    "resources": {"limits": resources} if resources else {},
                },
                {"name": "sidecar", "image": "busybox:1.36"},
            ],
        },
    }


def _wait_for(predicate, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


# --- discovery ---------------------------------------------------------------------------


def test_discovery_endpoints_parse_with_the_official_models(prod, state):
    api_client = prod.api_client
    version = client.VersionApi(api_client).get_code()
    assert (version.major, version.minor, version.git_version) == ("1", "31", "v1.31.4")
    assert version.build_date and version.git_tree_state == "clean"
    assert client.CoreApi(api_client).get_api_versions().versions == ["v1"]
    # scheduling.k8s.io/v1 (PriorityClasses, for borrowed units) and the stored-only groups onboarding applies
    # to (apps, RBAC, admission policies), the GPU Operator's ClusterPolicy, KubeVirt's VMIs; resource.k8s.io
    # only on DRA clusters.
    groups = client.ApisApi(api_client).get_api_versions().groups
    assert [(g.name, g.preferred_version.group_version) for g in groups] == [
        ("scheduling.k8s.io", "scheduling.k8s.io/v1"),
        ("apps", "apps/v1"),
        ("rbac.authorization.k8s.io", "rbac.authorization.k8s.io/v1"),
        ("admissionregistration.k8s.io", "admissionregistration.k8s.io/v1"),
        ("nvidia.com", "nvidia.com/v1"),
        ("kubevirt.io", "kubevirt.io/v1"),
    ]
    resources = {r.name: r for r in prod.get_api_resources().resources}
    assert resources["pods"].namespaced and "watch" in resources["pods"].verbs
    assert not resources["nodes"].namespaced
    assert resources["pods/eviction"].verbs == ["create"]


# --- watch -------------------------------------------------------------------------------


def test_watch_streams_added_modified_deleted_from_a_resource_version(prod, state):
    listed = prod.list_namespaced_pod(NS)
    rv = listed.metadata.resource_version
    prod.create_namespaced_pod(NS, _pod("watched"))
    prod.patch_namespaced_pod(
        "watched", NS, {"metadata": {"labels": {"seen": "yes"}}}, _content_type="application/merge-patch+json"
    )
    prod.delete_namespaced_pod("watched", NS)

    events = list(watch.Watch().stream(prod.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=1))

    # Created (Pending, unbound), bound by the scheduler, labelled, deleted: every change, in order.
    assert [(e["type"], e["object"].metadata.name) for e in events] == [
        ("ADDED", "watched"),
        ("MODIFIED", "watched"),
        ("MODIFIED", "watched"),
        ("DELETED", "watched"),
    ]
    assert events[0]["object"].spec.node_name is None and events[1]["object"].spec.node_name
    assert events[2]["object"].metadata.labels["seen"] == "yes"
    versions = [int(e["object"].metadata.resource_version) for e in events]
    assert versions == sorted(set(versions))


def test_watch_without_resource_version_starts_with_synthetic_added_then_follows(prod, state):
    existing = {p.metadata.name for p in prod.list_namespaced_pod(NS).items}
    stream = watch.Watch()
    seen: list[tuple[str, str]] = []

    def later():
        time.sleep(0.3)
        prod.create_namespaced_pod(NS, _pod("late"))

    thread = threading.Thread(target=later)
    thread.start()
    for event in stream.stream(prod.list_namespaced_pod, NS, timeout_seconds=3):
        seen.append((event["type"], event["object"].metadata.name))
        if event["object"].metadata.name == "late":
            stream.stop()
    thread.join()
    assert {name for kind, name in seen[:-1] if kind == "ADDED"} == existing
    assert seen[-1] == ("ADDED", "late")


def test_watch_selectors_filter_events(prod, state):
    rv = prod.list_namespaced_pod(NS).metadata.resource_version
    prod.create_namespaced_pod(NS, _pod("one"))
    prod.create_namespaced_pod(NS, _pod("two"))
    events = list(
        watch.Watch().stream(
            prod.list_namespaced_pod, NS, resource_version=rv, label_selector="app=two", timeout_seconds=1
        )
    )
    assert {e["object"].metadata.name for e in events} == {"two"}


def test_watch_sends_bookmarks_when_allowed(prod, state):
    state.api.watch_bookmark_s = 0.2
    stream = watch.Watch()
    kinds = [
        e["type"]
        for e in stream.stream(
            prod.list_node,
            resource_version=str(state.cluster("prod").rv),
            allow_watch_bookmarks=True,
            timeout_seconds=1,
        )
    ]
    assert kinds and set(kinds) == {"BOOKMARK"}
    assert stream.resource_version == str(state.cluster("prod").rv)


def test_watch_from_a_compacted_resource_version_is_410_gone(prod, state):
    old = prod.list_node().metadata.resource_version
    prod.patch_node(
        "prod-h100-full-01", {"metadata": {"labels": {"x": "1"}}}, _content_type="application/merge-patch+json"
    )
    state.cluster("prod").compact()
    with pytest.raises(ApiException) as info:
        list(watch.Watch().stream(prod.list_node, resource_version=old, timeout_seconds=1))
    assert info.value.status == 410
    assert "Expired" in info.value.reason and "too old resource version" in info.value.reason


def test_watch_window_compacts_old_history(prod, state):
    state.api.watch_window = 3
    old = prod.list_namespaced_config_map("gpu-operator").metadata.resource_version
    for i in range(5):
        prod.create_namespaced_config_map("gpu-operator", {"metadata": {"name": f"c{i}"}})
    with pytest.raises(ApiException) as info:
        list(
            watch.Watch().stream(
                prod.list_namespaced_config_map, "gpu-operator", resource_version=old, timeout_seconds=1
            )
        )
    assert info.value.status == 410


def test_watch_1_is_a_watch_too_as_json_lines(server, state):
    rv = state.cluster().rv
    with state.lock:
        kube.ClusterApi(state.cluster()).create("configmaps", "default", {"metadata": {"name": "raw"}})
    url = f"{server.url}/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}&timeoutSeconds=1"
    with urllib.request.urlopen(url, timeout=5) as answer:
        assert answer.headers["Transfer-Encoding"] == "chunked"
        lines = [json.loads(line) for line in answer.read().splitlines() if line.strip()]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("ADDED", "raw")]


# --- lists -------------------------------------------------------------------------------


def test_continue_pages_are_a_snapshot_at_the_first_pages_resource_version(prod, state):
    first = prod.list_node(limit=2)
    names = [n.metadata.name for n in first.items]
    everything = [n.metadata.name for n in prod.list_node().items]
    later = everything[2]
    prod.patch_node(
        later, {"metadata": {"labels": {"changed": "after-first-page"}}}, _content_type="application/merge-patch+json"
    )
    state.faults.node_vanish("prod", everything[3])

    token, pages = first.metadata._continue, [first]
    while token:
        page = prod.list_node(limit=2, _continue=token)
        pages.append(page)
        token = page.metadata._continue
    for page in pages[1:]:
        names += [n.metadata.name for n in page.items]
        assert page.metadata.resource_version == first.metadata.resource_version
    assert names == everything  # the vanished node is still in the snapshot
    snapshot_of_later = next(n for p in pages for n in p.items if n.metadata.name == later)
    assert "changed" not in snapshot_of_later.metadata.labels


def test_an_expired_continue_token_is_410_with_an_inconsistent_continuation(prod, state):
    first = prod.list_node(limit=2)
    prod.patch_node(
        first.items[0].metadata.name, {"metadata": {"labels": {"x": "1"}}}, _content_type="application/merge-patch+json"
    )
    state.cluster("prod").compact()
    with pytest.raises(ApiException) as info:
        prod.list_node(limit=2, _continue=first.metadata._continue)
    assert info.value.status == 410
    body = json.loads(info.value.body)
    assert body["reason"] == "Expired" and body["metadata"]["continue"]
    rest = prod.list_node(limit=100, _continue=body["metadata"]["continue"])
    assert rest.items and rest.items[0].metadata.name > first.items[-1].metadata.name


def test_list_resource_version_too_large_is_504_and_exact_past_is_410(prod, state):
    current = int(prod.list_node().metadata.resource_version)
    with pytest.raises(ApiException) as info:
        prod.list_node(resource_version=str(current + 100))
    assert info.value.status == 504 and "Too large resource version" in json.loads(info.value.body)["message"]
    prod.patch_node(
        "prod-h100-full-01", {"metadata": {"labels": {"x": "1"}}}, _content_type="application/merge-patch+json"
    )
    with pytest.raises(ApiException) as info:
        prod.list_node(resource_version=str(current), resource_version_match="Exact")
    assert info.value.status == 410
    assert prod.list_node(resource_version=str(current), resource_version_match="NotOlderThan").items


def test_the_kubernetes_adapter_pages_through_a_changing_cluster_consistently(kubeconfigs, state):
    from capacity.adapters.kubernetes import KubernetesClient

    with KubernetesClient.from_kubeconfig(kubeconfigs["prod"], page_size=2) as kc:
        expected = [n.name for n in kc.list_nodes()]
        original = KubernetesClient._call

        def call_and_change(self, method, *args, **kwargs):
            answer = original(self, method, *args, **kwargs)
            if method.__name__ == "list_node" and not kwargs.get("_continue"):
                state.faults.node_vanish("prod", expected[-1])  # between the first page and the rest
            return answer

        KubernetesClient._call = call_and_change
        try:
            assert [n.name for n in kc.list_nodes()] == expected
        finally:
            KubernetesClient._call = original


# --- strategic merge patch ---------------------------------------------------------------


def test_strategic_merge_patch_merges_containers_by_name(prod, state):
    prod.create_namespaced_pod(NS, _pod("smp"))
    patched = prod.patch_namespaced_pod(
        "smp",
        NS,
        {"spec": {"containers": [{"name": "sidecar", "image": "busybox:1.37"}]}},
        _content_type="application/strategic-merge-patch+json",
    )
    images = {c.name: c.image for c in patched.spec.containers}
    assert images == {"main": "busybox:1.36", "sidecar": "busybox:1.37"}
    assert patched.spec.containers[0].env[0].name == "A"  # the untouched container keeps its fields


def test_a_merge_patch_replaces_the_containers_list_and_is_refused(prod, state):
    prod.create_namespaced_pod(NS, _pod("jmp"))
    with pytest.raises(ApiException) as info:
        prod.patch_namespaced_pod(
            "jmp",
            NS,
            {"spec": {"containers": [{"name": "sidecar", "image": "busybox:1.37"}]}},
            _content_type="application/merge-patch+json",
        )
    assert info.value.status == 422


def test_strategic_merge_patch_rules():
    target = {
        "metadata": {"finalizers": ["a"]},
        "spec": {
            "containers": [{"name": "c", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}],
            "tolerations": [{"key": "t1", "operator": "Exists"}],
            "taints": [{"key": "k1", "effect": "NoSchedule"}],
        },
    }
    patch = {
        "metadata": {"finalizers": ["b"]},
        "spec": {
            "containers": [{"name": "c", "env": [{"name": "B", "$patch": "delete"}, {"name": "C", "value": "3"}]}],
            "tolerations": [{"key": "t2", "operator": "Exists"}],
            "taints": [{"key": "k2", "effect": "NoSchedule"}],
        },
    }
    result = kube.strategic_merge_patch(target, patch)
    assert result["metadata"]["finalizers"] == ["a", "b"]
    assert result["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}, {"name": "C", "value": "3"}]
    # Tolerations and node taints are atomic lists in k8s.io/api: replaced whole, as on a real server.
    assert result["spec"]["tolerations"] == [{"key": "t2", "operator": "Exists"}]
    assert result["spec"]["taints"] == [{"key": "k2", "effect": "NoSchedule"}]
    assert target["spec"]["containers"][0]["env"][1] == {"name": "B", "value": "2"}  # input untouched
    with pytest.raises(kube.ApiError):
        kube.strategic_merge_patch(target, {"spec": {"containers": [{"image": "x"}]}})


# --- pod phases over time ------------------------------------------------------------------


def test_a_new_pod_is_container_creating_then_running(prod, state):
    state.api.pod_start_delay_s = 0.4
    prod.create_namespaced_pod(NS, _pod("slow", **{"nvidia.com/mig-1g.10gb": "1"}))
    pod = prod.read_namespaced_pod("slow", NS)
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name  # bound, devices allocated
    assert pod.status.container_statuses[0].state.waiting.reason == "ContainerCreating"
    assert pod.status.pod_ip is None
    running = _wait_for(lambda: (p := prod.read_namespaced_pod("slow", NS)).status.phase == "Running" and p)
    assert running.status.container_statuses[0].state.running is not None
    assert running.status.pod_ip


def test_a_deleted_pod_is_terminating_for_its_grace_period_then_gone(prod, state):
    state.api.pod_termination_grace_s = 0.5
    rv = prod.list_namespaced_pod(NS).metadata.resource_version
    victim = prod.list_namespaced_pod(NS, label_selector="app=detector").items[0].metadata.name
    answer = prod.delete_namespaced_pod(victim, NS)
    assert answer.metadata.deletion_timestamp is not None
    assert answer.metadata.deletion_grace_period_seconds == 30
    pod = prod.read_namespaced_pod(victim, NS)
    assert pod.metadata.deletion_timestamp is not None and pod.status.phase == "Running"
    with pytest.raises(ApiException) as info:  # the name is still taken while it terminates
        prod.create_namespaced_pod(NS, _pod(victim))
    assert info.value.status == 409

    def gone():
        try:
            prod.read_namespaced_pod(victim, NS)
        except ApiException as exc:
            return exc.status == 404
        return False

    _wait_for(gone)
    events = [
        (e["type"], e["object"].metadata.name, e["object"].metadata.deletion_timestamp is not None)
        for e in watch.Watch().stream(prod.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=1)
    ]
    assert events == [("MODIFIED", victim, True), ("DELETED", victim, True)]


def test_grace_period_zero_deletes_at_once(prod, state):
    state.api.pod_termination_grace_s = 30
    victim = prod.list_namespaced_pod(NS, label_selector="app=tracker").items[0].metadata.name
    prod.delete_namespaced_pod(victim, NS, grace_period_seconds=0)
    with pytest.raises(ApiException) as info:
        prod.read_namespaced_pod(victim, NS)
    assert info.value.status == 404


def test_a_terminating_pod_keeps_its_devices_until_it_is_gone(state):
    state.api.pod_termination_grace_s = 60
    cluster = state.cluster("prod")
    api = kube.ClusterApi(cluster)
    with state.lock:
        victim = next(k for k, r in cluster.pods.items() if r.obj["metadata"]["labels"].get("app") == "detector")
        node = cluster.nodes[cluster.pods[victim].obj["spec"]["nodeName"]]
        held = {d for d, owner in node.assigned.items() if owner == victim}
        api.delete("pods", *victim)
        assert held and {d for d, owner in node.assigned.items() if owner == victim} == held
        state.run_kubelet()  # the kubelet finishes the termination now
        assert victim not in cluster.pods
        assert not {d for d, owner in node.assigned.items() if owner == victim}

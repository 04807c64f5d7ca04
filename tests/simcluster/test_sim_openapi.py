"""/openapi/v2 and /openapi/v3 as kube-openapi's handlers serve them (simcluster/openapi.py), and
fieldValidation on writes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest


def get(server, path: str, accept: str = "application/json"):
    request = urllib.request.Request(server.cluster_url("prod") + path, headers={"Accept": accept})
    return urllib.request.urlopen(request, timeout=10)


def test_v3_discovery_points_at_each_group_version_with_its_hash(server):
    paths = json.load(get(server, "/openapi/v3"))["paths"]
    assert {"api/v1", "apis/nvidia.com/v1", "apis/kubevirt.io/v1"} <= set(paths)
    url = paths["api/v1"]["serverRelativeURL"]
    answer = get(server, url)
    assert answer.headers["Cache-Control"] == "public, immutable"
    assert answer.headers["ETag"] == '"' + url.split("hash=")[1] + '"'
    document = json.load(answer)
    node = document["components"]["schemas"]["io.k8s.api.core.v1.Node"]
    assert node["x-kubernetes-group-version-kind"] == [{"group": "", "kind": "Node", "version": "v1"}]
    patch = document["paths"]["/api/v1/nodes/{name}"]["patch"]
    assert "fieldValidation" in {p["name"] for p in patch["parameters"]}


def test_a_stale_hash_is_redirected_to_the_current_one(server):
    answer = get(server, "/openapi/v3/apis/nvidia.com/v1?hash=0BAD")  # urllib follows the 301
    assert answer.url != server.cluster_url("prod") + "/openapi/v3/apis/nvidia.com/v1?hash=0BAD"
    assert "com.nvidia.v1.ClusterPolicy" in json.load(answer)["components"]["schemas"]


def test_v2_is_served_as_json_and_refused_as_protobuf(server):
    document = json.load(get(server, "/openapi/v2"))
    assert document["swagger"] == "2.0"
    assert "io.k8s.api.core.v1.ConfigMap" in document["definitions"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        get(server, "/openapi/v2", accept="application/com.github.proto-openapi.spec.v2@v1.0+protobuf")
    assert refused.value.code == 406


def _create(server, query: str, body: dict):
    request = urllib.request.Request(
        server.cluster_url("prod") + "/api/v1/namespaces/default/configmaps" + query,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    return urllib.request.urlopen(request, timeout=10)


def test_field_validation_strict_refuses_and_warn_warns(server):
    body = {"metadata": {"name": "x", "labls": {}}, "data": {"a": "1"}, "spec": {}}
    with pytest.raises(urllib.error.HTTPError) as refused:
        _create(server, "?fieldValidation=Strict", body)
    assert refused.value.code == 400
    message = json.load(refused.value)["message"]
    assert message == 'strict decoding error: unknown field "metadata.labls", unknown field "spec"'
    warned = _create(server, "?fieldValidation=Warn", body)
    assert warned.status == 201
    assert 'unknown field \\"spec\\"' in warned.headers["Warning"]
    assert _create(server, "", {**body, "metadata": {"name": "y"}}).status == 201  # Ignore: the default

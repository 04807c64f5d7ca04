"""The read-only capacity API: operators read the mirror, everyone else gets 403."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from capacity.services.discovery import discover_cluster

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("retry_waits")]


@pytest.fixture
def demo(simcluster):
    sim = simcluster("demo")
    for cluster in sim.register().values():
        assert discover_cluster(cluster.pk, inventory="inline").run.status == "succeeded"
    sim.faults.gpu_lost("prod", "prod-h100-full-01", 0)
    discover_cluster(sim.clusters["prod"].pk, inventory="inline")
    return sim


def api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.mark.parametrize(
    "url", ["clusters", "discovery-runs", "nodes", "gpus", "specs", "specs/totals"], ids=lambda u: u
)
def test_only_operators_read_the_mirror(url, alice, charlie):
    assert api(alice).get(f"/api/v1/capacity/{url}/").status_code == 403
    assert api(charlie).get(f"/api/v1/capacity/{url}/").status_code == 403
    assert APIClient().get(f"/api/v1/capacity/{url}/").status_code in (401, 403)


def test_clusters_nodes_and_gpus(demo, operator):
    client = api(operator)
    clusters = client.get("/api/v1/capacity/clusters/").json()["results"]
    assert [(c["name"], c["status"], c["nodes"], c["gpus"]) for c in clusters] == [
        ("dev", "ok", 2, 16),
        ("prod", "ok", 6, 47),
    ]
    nodes = client.get("/api/v1/capacity/nodes/", {"cluster": "prod", "tier": "1"}).json()["results"]
    assert [(n["name"], n["gpus_present"], n["mig_instances"], n["mig_config"]) for n in nodes] == [
        ("prod-h100-bal-01", 8, 32, "all-balanced"),
        ("prod-h100-bal-02", 8, 32, "all-balanced"),
    ]
    lost = client.get("/api/v1/capacity/gpus/", {"lost": "true"}).json()["results"]
    assert [(g["cluster"], g["node"], g["index"], g["health"]) for g in lost] == [
        ("prod", "prod-h100-full-01", 0, "lost")
    ]
    runs = client.get("/api/v1/capacity/discovery-runs/", {"cluster": "prod"}).json()
    assert runs["count"] == 2 and runs["results"][0]["status"] == "succeeded"


def test_spec_totals_read_like_the_seed(demo, operator):
    totals = api(operator).get("/api/v1/capacity/specs/totals/", {"cluster": "prod"}).json()
    assert [t["label"] for t in totals] == [
        "H100-80GB full GPU x 16",
        "H100-80GB 1g.10gb x 40",
        "H100-80GB 2g.20gb x 20",
        "H100-80GB 3g.40gb x 32",
        "H100-80GB 4g.40gb x 12",
    ]
    assert totals[0]["allocatable"] == 15  # the lost GPU dropped out of allocatable
    dev = api(operator).get("/api/v1/capacity/specs/totals/", {"cluster": "dev"}).json()
    assert [t["label"] for t in dev] == ["H200-141GB time-slice x 64"]  # 2 nodes x 8 GPUs x 4 replicas


def test_node_list_queries_do_not_grow_with_rows(demo, operator):
    client = api(operator)
    with CaptureQueriesContext(connection) as few:
        client.get("/api/v1/capacity/nodes/", {"page_size": 2})
    with CaptureQueriesContext(connection) as many:
        client.get("/api/v1/capacity/nodes/", {"page_size": 8})
    assert len(few) == len(many)

"""One cluster's node view and one GPU's MIG picture, as JSON."""

import pytest
from dashboard_world import add_signals

pytestmark = pytest.mark.django_db


def _units(gpu):
    if gpu["mig"]:
        return [
            (u["profile"], u["start"], u["size"], u["status"], u["project"], u["workload"]) for u in gpu["instances"]
        ]
    unit = gpu["unit"]
    return [("full", None, None, unit["status"], unit["project"], unit["workload"])]


def test_node_view_tiles_per_gpu_and_mig_instance(client, operator, world):
    client.force_login(operator)
    data = client.get(f"/admin/dashboard/clusters/{world.alpha.pk}/data.json").json()
    assert data["summary"] == {
        "nodes": 2,
        "gpus": 3,
        "mig_instances": 4,
        "health": {"error": 0, "throttling": 0, "caution": 0},
    }
    assert [n["name"] for n in data["nodes"]] == ["a1", "a2"]  # a3 is gone
    a1, a2 = data["nodes"]
    assert [(g["index"], g["memory_slices"]) for g in a1["gpus"]] == [(0, 8), (1, 8)]
    assert _units(a1["gpus"][0]) == [
        ("3g.40gb", 0, 4, "in_use", "team-a", "team-a/serve-0"),
        ("3g.40gb", 4, 4, "ready", "team-a", None),
    ]
    assert _units(a1["gpus"][1]) == [
        ("2g.20gb", 0, 2, "available", None, None),
        ("1g.10gb", 4, 1, "in_use", "team-b", "team-b/batch-0"),
    ]
    assert [g["index"] for g in a2["gpus"]] == [0]  # the lost GPU 1 is not drawn
    assert _units(a2["gpus"][0]) == [("full", None, None, "ready", "team-a", None)]
    assert data["gpu_url"] == "/admin/dashboard/gpus/{id}/"
    assert [row["total"] for row in data["profiles"]] == [1, 1, 2, 0, 0, 1]


def test_node_view_carries_latest_metrics_and_open_events(client, operator, world):
    add_signals(world)
    client.force_login(operator)
    data = client.get(f"/admin/dashboard/clusters/{world.alpha.pk}/data.json").json()
    assert data["metrics_available"] is True
    gpu0, gpu1 = data["nodes"][0]["gpus"]
    assert (gpu0["metrics"]["power_w"], gpu0["metrics"]["sm_active_pct"], gpu0["metrics"]["temperature_c"]) == (
        350.0,
        42.0,
        61,
    )
    assert gpu0["instances"][0]["metrics"]["sm_active_pct"] == 42.0
    assert gpu0["instances"][0]["metrics"]["power_w"] is None  # power is per GPU only
    assert gpu0["events"] == []  # its only event is resolved
    assert [(e["level"], e["rule"]) for e in gpu1["events"]] == [("critical", "Critical XID error")]
    assert data["series"]["series"][0]["label"] == "alpha"


def test_gpu_mig_picture_on_an_a30_has_four_slices(client, operator, world):
    client.force_login(operator)
    data = client.get(f"/admin/dashboard/gpus/{world.gpus['b1-0'].pk}/data.json").json()
    gpu = data["gpu"]
    assert (gpu["product"], gpu["memory_slices"], gpu["mig"]) == ("NVIDIA A30", 4, True)
    assert [(u["profile"], u["shape"], u["start"], u["size"], u["status"]) for u in gpu["instances"]] == [
        ("2g.12gb", "2g", 0, 2, "available"),
        ("2g.12gb", "2g", 2, 2, "available"),
    ]
    assert (data["cluster"]["name"], data["node"]["name"]) == ("beta", "b1")
    assert data["series"] == {"available": False, "reason": "No metrics recorded in the last 3 hours yet."}


def test_gpu_page_renders_with_breadcrumbs(client, operator, world):
    client.force_login(operator)
    gpu = world.gpus["a1-0"]
    page = client.get(f"/admin/dashboard/gpus/{gpu.pk}/")
    html = page.content.decode()
    assert page.status_code == 200
    assert f'data-source="/admin/dashboard/gpus/{gpu.pk}/data.json"' in html
    assert f'href="/admin/dashboard/clusters/{world.alpha.pk}/"' in html


def test_unknown_cluster_or_gpu_is_404(client, operator, world):
    client.force_login(operator)
    assert client.get("/admin/dashboard/clusters/999999/data.json").status_code == 404
    assert client.get("/admin/dashboard/gpus/999999/").status_code == 404

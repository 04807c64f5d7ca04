"""Operator API: layouts, reconfigurations (create, resume, roll back), windows, time-slicing, planning."""

import pytest
from reconfig_sim import allocate, gpu_row, node_row, start_sim
from rest_framework.test import APIClient

from capacity.models import MaintenanceWindow, MigLayout, MigReconfiguration, TimeSlicingPolicy
from operations import reconfiguration as rc
from operations.tasks import reconfiguration_step_task

pytestmark = pytest.mark.django_db

ENDPOINTS = [
    ("get", "/api/v1/mig-layouts/"),
    ("get", "/api/v1/mig-reconfigurations/"),
    ("get", "/api/v1/maintenance-windows/"),
    ("get", "/api/v1/time-slicing-policies/"),
    ("get", "/api/v1/capacity-plan/"),
    ("post", "/api/v1/take-offline/"),
    ("get", "/api/v1/rebalance/"),
    ("post", "/api/v1/mig-reconfigurations/"),
]


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"]}, "")])
    yield sim
    sim.server.stop()


@pytest.fixture
def api(operator):
    client = APIClient()
    client.force_authenticate(operator)
    return client


@pytest.mark.parametrize(("method", "url"), ENDPOINTS)
def test_only_operators(alice, method, url):
    client = APIClient()
    assert getattr(client, method)(url, {}, format="json").status_code in (401, 403)
    client.force_authenticate(alice)
    assert getattr(client, method)(url, {}, format="json").status_code == 403


def test_create_reconfiguration_enqueues_after_commit(sim, api, django_capture_on_commit_callbacks):
    node = node_row("gpu-a")
    with django_capture_on_commit_callbacks() as callbacks:
        response = api.post(
            "/api/v1/mig-reconfigurations/",
            {"node": node.pk, "per_gpu": {"1": ["7g.80gb"]}, "backend": "agent", "force": True},
            format="json",
        )
    assert response.status_code == 201, response.data
    assert len(callbacks) == 1
    body = response.json()
    assert (body["node_name"], body["step"], body["state"], body["target"]) == (
        "gpu-a",
        "plan",
        "pending",
        {"1": ["7g.80gb"]},
    )
    assert [s["event"] for s in body["steps"]] == ["created"]


def test_create_refused_is_409_and_writes_nothing(sim, api, django_capture_on_commit_callbacks):
    allocate(gpu_row("gpu-a", 0), mig_start=0)
    with django_capture_on_commit_callbacks() as callbacks:
        response = api.post(
            "/api/v1/mig-reconfigurations/",
            {"node": node_row("gpu-a").pk, "named": "all-1g.10gb", "force": True},
            format="json",
        )
    assert response.status_code == 409
    assert response.json() == {
        "detail": "1 active allocation(s) on affected GPUs (GPU 0: 1); choose drain to evict their pods"
    }
    assert callbacks == []
    assert MigReconfiguration.objects.count() == 0


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (
            {"named": "all-1g.10gb", "per_gpu": {"0": []}},
            "give exactly one of a layout, a named config or per-GPU profiles",
        ),
        ({"named": "all-9g.99gb"}, "H100-80GB has no named config 'all-9g.99gb'"),
        ({"per_gpu": {"0": ["4g.40gb", "4g.40gb"]}}, "GPU 0: too many instances of 4g.40gb: 2 (max 1)"),
        ({"per_gpu": {"5": ["7g.80gb"]}}, "has no GPU 5"),
    ],
)
def test_create_bad_input_is_400(sim, api, payload, error):
    response = api.post(
        "/api/v1/mig-reconfigurations/", {"node": node_row("gpu-a").pk, "force": True, **payload}, format="json"
    )
    assert response.status_code == 400
    assert error in response.json()["non_field_errors"][0]
    assert MigReconfiguration.objects.count() == 0


def test_resume_and_rollback(sim, api):
    reconf = rc.create(node_row("gpu-a"), {"1": ["7g.80gb"]}, force=True)
    assert api.post(f"/api/v1/mig-reconfigurations/{reconf.pk}/resume/").status_code == 409
    for step in ("plan", "check", "cordon"):
        reconfiguration_step_task(reconf.pk, step)
    sim.state.faults.node_vanish(sim.cluster.name, "gpu-a")
    assert reconfiguration_step_task(reconf.pk, "drain") == "failed"
    sim.state.faults.reset()

    response = api.post(f"/api/v1/mig-reconfigurations/{reconf.pk}/rollback/")
    assert response.status_code == 200
    assert response.json()["rollback_of"] == reconf.pk
    assert response.json()["force"] is True
    assert api.post(f"/api/v1/mig-reconfigurations/{reconf.pk}/resume/").status_code == 409
    detail = api.get(f"/api/v1/mig-reconfigurations/{reconf.pk}/").json()
    assert detail["state"] == "rolled_back"
    assert [s["event"] for s in detail["steps"]][-2:] == ["failed", "rollback"]


def test_list_is_a_fixed_number_of_queries(sim, api, django_assert_num_queries):
    for index in ("0", "1"):
        reconf = rc.create(node_row("gpu-a"), {index: ["7g.80gb"]}, force=True)
        MigReconfiguration.objects.filter(pk=reconf.pk).update(state="succeeded")
    with django_assert_num_queries(3):  # count, page (with node), steps
        response = api.get("/api/v1/mig-reconfigurations/?state=succeeded")
    assert response.json()["count"] == 2


def test_layouts_are_validated_and_published(sim, api, django_capture_on_commit_callbacks):
    bad = api.post(
        "/api/v1/mig-layouts/", {"name": "bad", "product": "H100-80GB", "gpus": {"all": ["4g.40gb"] * 2}}, format="json"
    )
    assert bad.status_code == 400
    assert bad.json() == {"gpus": ["GPU all: too many instances of 4g.40gb: 2 (max 1)"]}
    with django_capture_on_commit_callbacks() as callbacks:
        good = api.post(
            "/api/v1/mig-layouts/",
            {"name": "halves", "product": "NVIDIA H100 80GB HBM3", "gpus": {"all": ["3g.40gb"] * 2}},
            format="json",
        )
    assert good.status_code == 201, good.json()
    assert good.json()["product"] == "H100-80GB"
    assert good.json()["config_name"] == "gpuaas-halves"
    assert len(callbacks) == 1  # rewrite the ConfigMap of every cluster
    assert MigLayout.objects.get().name == "halves"


def test_windows_and_time_slicing(sim, api, django_capture_on_commit_callbacks):
    bad = api.post("/api/v1/maintenance-windows/", {"cluster": sim.cluster.pk, "weekday": 2}, format="json")
    assert bad.status_code == 400
    assert "weekday" in bad.json()
    ok = api.post(
        "/api/v1/maintenance-windows/",
        {"cluster": sim.cluster.pk, "weekday": 2, "start_time": "02:00", "end_time": "04:00"},
        format="json",
    )
    assert ok.status_code == 201, ok.json()
    assert MaintenanceWindow.objects.count() == 1

    policy = api.post(
        "/api/v1/time-slicing-policies/", {"cluster": sim.cluster.pk, "node_group": "dev", "replicas": 4}, format="json"
    )
    assert policy.status_code == 201, policy.json()
    assert policy.json()["memory_isolation"] is False
    assert policy.json()["config_key"] == "gpuaas-dev-x4"
    with django_capture_on_commit_callbacks() as callbacks:
        queued = api.post(f"/api/v1/time-slicing-policies/{policy.json()['id']}/apply/")
    assert queued.status_code == 202
    assert len(callbacks) == 1
    assert (
        api.post(
            "/api/v1/time-slicing-policies/", {"cluster": sim.cluster.pk, "replicas": 1}, format="json"
        ).status_code
        == 400
    )
    assert TimeSlicingPolicy.objects.count() == 1


def test_capacity_plan_take_offline_and_rebalance(sim, api):
    plan = api.get(
        "/api/v1/capacity-plan/",
        {"cluster": sim.cluster.pk, "product": "H100-80GB", "gpus": 8, "layout": "4g.40gb,3g.40gb"},
    )
    assert plan.status_code == 200
    tiers = plan.json()["tiers"]
    assert [(t["tier"], t["total"], t["free"], t["reserve"]) for t in tiers] == [("", 3, 3, 2)]
    assert [(g["use"], g["slots"]) for g in plan.json()["current"]["groups"]] == [("mig", 2), ("full", 1)]
    assert plan.json()["proposed"]["tiers"]["1"]["slots"] == 16
    bad = api.get("/api/v1/capacity-plan/", {"product": "H100-80GB", "gpus": 1, "layout": "7g.80gb,1g.10gb"})
    assert bad.status_code == 400
    assert "layout" in bad.json()

    allocate(gpu_row("gpu-a", 0), mig_start=0)
    check = api.post("/api/v1/take-offline/", {"gpus": [gpu_row("gpu-a", 0).pk]}, format="json")
    assert check.status_code == 200
    assert check.json()["covered"] is False
    assert check.json()["shortfall"] == {"H100-80GB 3g.40gb": 1}
    assert api.post("/api/v1/take-offline/", {}, format="json").status_code == 400

    proposal = api.get("/api/v1/rebalance/", {"cluster": sim.cluster.pk, "product": "H100-80GB", "days": 7})
    assert proposal.status_code == 200
    assert proposal.json()["demand"] == {}
    assert api.get("/api/v1/rebalance/", {"cluster": sim.cluster.pk, "product": "Z9"}).status_code == 400


def test_forcing_a_reconfiguration_needs_the_force_permission(sim, staff_nobody, django_capture_on_commit_callbacks):
    from django.contrib.auth.models import Permission

    staff_nobody.user_permissions.add(*Permission.objects.filter(codename__in=["add_migreconfiguration"]))
    client = APIClient()
    client.force_authenticate(staff_nobody)
    body = {"node": node_row("gpu-a").pk, "per_gpu": {"1": ["7g.80gb"]}, "backend": "agent", "force": True}
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post("/api/v1/mig-reconfigurations/", body, format="json")
    assert response.status_code == 403
    assert response.data == {
        "detail": "Forcing a reconfiguration needs the capacity.force_migreconfiguration permission."
    }
    assert (MigReconfiguration.objects.count(), callbacks) == (0, [])


def test_the_operators_group_may_force(sim, staff_operator, django_capture_on_commit_callbacks):
    client = APIClient()
    client.force_authenticate(staff_operator)
    body = {"node": node_row("gpu-a").pk, "per_gpu": {"1": ["7g.80gb"]}, "backend": "agent", "force": True}
    with django_capture_on_commit_callbacks(execute=False):
        assert client.post("/api/v1/mig-reconfigurations/", body, format="json").status_code == 201
    assert MigReconfiguration.objects.get().force is True

"""Admin: MIG pictures, reconfigure with a confirmation page, resume/roll-back actions, planning pages."""

import pytest
from django.urls import reverse
from reconfig_sim import allocate, gpu_row, node_row, start_sim

from capacity.models import MigLayout, MigReconfiguration, TimeSlicingPolicy
from operations import reconfiguration as rc
from operations.tasks import reconfiguration_step_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 2, {0: ["3g.40gb", "3g.40gb"]}, "")])
    yield sim
    sim.server.stop()


@pytest.fixture
def staff(client, operator):
    client.force_login(operator)
    return client


ADD = reverse("admin:capacity_migreconfiguration_add")


def test_gpu_and_node_pages_draw_the_layout(sim, staff):
    allocate(gpu_row("gpu-a", 0), mig_start=4)
    page = staff.get(reverse("admin:capacity_gpucapacity_change", args=[gpu_row("gpu-a", 0).pk])).content.decode()
    assert 'class="mig-picture"' in page
    assert 'title="3g.40gb at memory slice 0 (free)"' in page
    assert 'title="3g.40gb at memory slice 4 (allocated)"' in page
    assert "compute 6 of 7 slices" in page

    page = staff.get(reverse("admin:capacity_nodecapacity_change", args=[node_row("gpu-a").pk])).content.decode()
    assert page.count('class="mig-picture"') == 2
    assert "MIG off: one full GPU" in page
    assert f"{ADD}?node={node_row('gpu-a').pk}" in page


def test_reconfigure_shows_the_impact_then_creates_on_confirm(sim, staff, django_capture_on_commit_callbacks):
    sim.add_gpu_pod("gpu-a", "notebook", "nvidia.com/gpu")
    node = node_row("gpu-a")
    assert staff.get(ADD, {"node": node.pk}).status_code == 200
    form = {"node": node.pk, "per_gpu": "1: 4g.40gb,3g.40gb", "backend": "operator", "force": "on"}

    preview = staff.post(ADD, {**form, "preview": "1"})
    html = preview.content.decode()
    assert preview.status_code == 200
    assert "Pods to wait for (1)" in html
    assert "team-a/notebook" in html
    assert "<td>full GPU</td><td>1</td><td>0</td>" in html
    assert "<td>4g.40gb</td><td>0</td><td>1</td>" in html
    assert 'name="confirm"' in html
    assert MigReconfiguration.objects.count() == 0

    with django_capture_on_commit_callbacks() as callbacks:
        done = staff.post(ADD, {**form, "confirm": "1"})
    reconf = MigReconfiguration.objects.get()
    assert done.status_code == 302
    assert done.url == reverse("admin:capacity_migreconfiguration_change", args=[reconf.pk])
    assert len(callbacks) == 1
    assert (reconf.target, reconf.created_by.username) == ({"1": ["4g.40gb", "3g.40gb"]}, "operator")
    assert staff.get(done.url).status_code == 200


def test_a_refused_reconfiguration_has_no_confirm_button(sim, staff, django_capture_on_commit_callbacks):
    allocate(gpu_row("gpu-a", 0), mig_start=0)
    form = {"node": node_row("gpu-a").pk, "named": "all-1g.10gb", "backend": "operator", "force": "on"}
    html = staff.post(ADD, {**form, "preview": "1"}).content.decode()
    assert "1 active allocation(s) on affected GPUs (GPU 0: 1); choose drain to evict their pods" in html
    assert 'name="confirm"' not in html
    with django_capture_on_commit_callbacks() as callbacks:
        again = staff.post(ADD, {**form, "confirm": "1"})
    assert again.status_code == 200
    assert callbacks == []
    assert MigReconfiguration.objects.count() == 0


def test_resume_and_rollback_actions(sim, staff):
    reconf = rc.create(node_row("gpu-a"), {"1": ["7g.80gb"]}, force=True)
    for step in ("plan", "check"):
        reconfiguration_step_task(reconf.pk, step)
    sim.state.faults.node_vanish(sim.cluster.name, "gpu-a")
    assert reconfiguration_step_task(reconf.pk, "cordon") == "failed"
    sim.state.faults.reset()
    changelist = reverse("admin:capacity_migreconfiguration_changelist")

    response = staff.post(changelist, {"action": "resume_selected", "_selected_action": [reconf.pk]}, follow=True)
    assert "1 reconfiguration resumed." in response.content.decode()
    reconf.refresh_from_db()
    assert reconf.state == "pending"

    response = staff.post(changelist, {"action": "rollback_selected", "_selected_action": [reconf.pk]}, follow=True)
    assert "0 reconfigurations rolled back." in response.content.decode()
    assert f"Reconfiguration #{reconf.pk} is pending, not failed" in response.content.decode()


def test_planning_pages(sim, staff):
    allocate(gpu_row("gpu-a", 0), mig_start=0)
    plan = staff.get(reverse("admin:capacity_capacity_plan"), {"product": "H100-80GB", "gpus": 8, "replicas": 4})
    assert plan.status_code == 200
    assert "no memory isolation" in plan.content.decode().lower()
    assert "<td>32</td>" in plan.content.decode()
    assert 'id="tier-plan"' in plan.content.decode()  # the live plan per tier, tier_plan()

    offline = staff.post(reverse("admin:capacity_take_offline"), {"nodes": [node_row("gpu-a").pk]})
    assert offline.status_code == 200
    assert "No: the remaining capacity does not cover every allocation" in offline.content.decode()

    rebalance = staff.get(
        reverse("admin:capacity_rebalance"), {"cluster": sim.cluster.pk, "product": "H100-80GB", "days": 30}
    )
    assert rebalance.status_code == 200
    assert "no change proposed" in rebalance.content.decode()


def test_layout_form_validates_and_time_slicing_warns(sim, staff):
    add = reverse("admin:capacity_miglayout_add")
    bad = staff.post(add, {"name": "x", "product": "H100-80GB", "gpus": '{"all": ["7g.80gb", "1g.10gb"]}'})
    assert bad.status_code == 200
    assert "compute slices exhausted" in bad.content.decode()
    assert MigLayout.objects.count() == 0

    page = staff.get(reverse("admin:capacity_timeslicingpolicy_add")).content.decode()
    assert "NO memory isolation" in page
    policy = TimeSlicingPolicy.objects.create(cluster=sim.cluster, node_group="dev", replicas=4)
    changelist = staff.get(reverse("admin:capacity_timeslicingpolicy_changelist")).content.decode()
    assert policy.config_key in changelist


def test_rebalance_create_needs_add_and_force_permissions(sim, client, staff_nobody):
    from django.contrib.auth.models import Permission

    grants = Permission.objects.filter(codename__in=["view_migreconfiguration", "add_migreconfiguration"])
    staff_nobody.user_permissions.add(*grants)
    client.force_login(staff_nobody)
    url = reverse("admin:capacity_rebalance")
    query = {"cluster": sim.cluster.pk, "product": "H100-80GB", "days": 30}
    assert client.get(url, query).status_code == 200
    forced = client.post(url, {**query, "backend": "agent", "force": "on", "create": "1"})
    assert forced.status_code == 403
    assert MigReconfiguration.objects.count() == 0
    add = client.post(
        ADD, {"node": node_row("gpu-a").pk, "per_gpu": "1: 7g.80gb", "backend": "agent", "force": "on", "confirm": "1"}
    )
    assert add.status_code == 403
    assert MigReconfiguration.objects.count() == 0

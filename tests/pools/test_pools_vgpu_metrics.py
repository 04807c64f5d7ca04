"""vGPU host-side metrics (issue #30): on a vm-vgpu node the node agent reads each vGPU through NVML (type, mdev
UUID, VM id, SM utilisation, framebuffer in use) with its poll; the signed report is ingested and monitoring keeps
one series per vGPU, attributed to the project whose VM (the VMI's virt-launcher pod) holds it, visible to that
project and not to others; an idle vGPU reservation is found like an idle MIG instance. Runs on SQLite and on
PostgreSQL (DATABASE_URL)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone
from test_pools_vgpu_kubevirt import NODE, _create_vmi, _discover, _vm_vgpu_node, _vmi

from capacity.adapters.kubernetes import api_url_for
from capacity.agent import node as agent
from capacity.agent import protocol
from capacity.models import WorkloadProfile
from capacity.vgpu import VGPU_TYPES
from monitoring.models import IdleReservation, Sample, Series
from monitoring.services import idle
from monitoring.services.reports import ingest_reports, poll_node
from pools import services
from pools.models import Allocation, PoolRequest
from pools.tasks import provision_pool_task
from simcluster.scheduler import SIM_SM_UTIL_ANNOTATION

pytestmark = pytest.mark.django_db


def _vgpu_pool(project, operator, bob, api, vgpu_type="H100XM-20C"):
    body = {"project": project.pk, "workload_type": "staging", "vgpu_type": vgpu_type, "count": 1}
    response = api(bob).post("/api/v1/pool-requests/", body, format="json")
    assert response.status_code == 201, response.data
    request = PoolRequest.objects.get(pk=response.data["id"])
    request.state = "submitted"
    request.save(update_fields=["state"])
    pool = services.approve(request, actor=operator)
    assert provision_pool_task(pool.pk) == "active"
    return pool


def _running_vm(sim, name="notebook-vm", sm_util=None):
    _create_vmi(sim, "team-a", _vmi(name))
    sim.state.run_kubelet()
    if sm_util is not None:  # what the guest does with its vGPU, as the simulated host sees it
        with sim.state.lock:
            for (namespace, pod), record in sim.state.cluster("prod").pods.items():
                if namespace == "team-a" and pod.startswith(f"virt-launcher-{name}-"):
                    record.obj["metadata"].setdefault("annotations", {})[SIM_SM_UTIL_ANNOTATION] = str(sm_util)
    _discover(sim)
    (row,) = WorkloadProfile.objects.running().filter(vmi_name=name)
    return row


def test_the_agent_reports_each_vgpu_and_monitoring_stores_it_as_the_vms_projects_unit(
    sim, api, bob, operator, project, django_user_model
):
    node = _vm_vgpu_node(sim, "H100XM-20C")
    _vgpu_pool(project, operator, bob, api)
    vm = _running_vm(sim)

    # The agent's signed report carries the vGPU readings beside the GPU's.
    report = agent.read_metrics("prod", NODE, api_url=api_url_for(sim.clusters["prod"]), slot=0)
    readings, error, _ = protocol.metrics_from_body(report["body"])
    assert error == ""
    (vgpu,) = [v for gpu in readings for v in gpu.vgpus]
    assert (vgpu.vgpu_type, vgpu.fb_total_mib) == ("H100XM-20C", 20 * 1024)
    assert vgpu.mdev_uuid in vm.device_ids
    assert vgpu.vm_id.startswith("team-a/virt-launcher-notebook-vm-")
    assert 0 < vgpu.sm_util_pct <= 100 and 0 < vgpu.fb_used_mib <= 20 * 1024
    assert (vgpu.enc_util_pct, vgpu.dec_util_pct) == (0, 0)

    # Ingested: one series per vGPU, keyed by its mdev UUID on its GPU, attributed to the VM's workload.
    result = poll_node(node.pk)
    assert (result.vgpus, result.error) == (1, "")
    (series,) = Series.objects.vgpus()
    assert (series.vgpu_uuid, series.vgpu_type, series.gpu_id) == (vgpu.mdev_uuid, "H100XM-20C", vm.gpu_id)
    assert (series.vgpu_workload_id, series.vgpu_workload.project_id) == (vm.pk, project.pk)
    assert series.mem_total_mib == 20 * 1024
    assert str(series) == f"vGPU H100XM-20C {vgpu.mdev_uuid}"
    (sample,) = Sample.objects.filter(series=series)
    assert sample.gpu_util == vgpu.sm_util_pct and 0 < sample.mem_used_mib <= 20 * 1024
    assert sample.sm_active is None  # GPM is not offered per vGPU: never a made-up value
    # The GPU keeps its own series; a vGPU is not the GPU.
    assert Series.objects.gpus().filter(gpu_id=vm.gpu_id).count() == 1

    # The same report again (a redelivery) writes nothing twice.
    again = agent.read_metrics("prod", NODE, api_url=api_url_for(sim.clusters["prod"]), slot=int(sample.ts.timestamp()))
    ingest_reports([again], window=False)
    assert Sample.objects.filter(series=series).count() == 1

    # The project's member sees the vGPU's series; an outsider does not.
    outsider = django_user_model.objects.create_user("charlie", "charlie@example.com", "pw-charlie-1")
    assert list(Series.objects.visible_to(bob).vgpus()) == [series]
    assert not Series.objects.visible_to(outsider).exists()
    listed = api(bob).get("/api/v1/monitoring/series/", {"kind": "vgpu"}).json()["results"]
    assert [(r["id"], r["kind"], r["vgpu_type"], r["vgpu_uuid"]) for r in listed] == [
        (series.pk, "vgpu", "H100XM-20C", vgpu.mdev_uuid)
    ]
    assert api(outsider).get("/api/v1/monitoring/series/", {"kind": "vgpu"}).json()["results"] == []

    # The VM stops: the next poll reports no vGPU and the series keeps its history.
    with sim.state.lock:
        from simcluster.kube import ClusterApi

        ClusterApi(sim.state.cluster("prod")).delete("virtualmachineinstances", "team-a", "notebook-vm", 0)
    sim.state.run_kubelet()
    assert poll_node(node.pk, at=timezone.now() + dt.timedelta(minutes=5)).vgpus == 0
    assert Sample.objects.filter(series=series).count() == 1


def test_an_idle_vgpu_reservation_is_found(sim, api, bob, operator, project, settings):
    settings.METRICS_INTERVAL_S = 1200
    settings.MONITORING_IDLE_WINDOW_H = 1
    settings.MONITORING_IDLE_MIN_COVERAGE_PCT = 50
    settings.MONITORING_IDLE_SM_PCT = 5
    node = _vm_vgpu_node(sim, "H100XM-20C")
    pool = _vgpu_pool(project, operator, bob, api)
    _running_vm(sim, sm_util=0)  # the VM runs and holds its vGPU, and does nothing with it
    now = timezone.now()
    (allocation,) = Allocation.objects.filter(pool=pool)
    Allocation.objects.filter(pk=allocation.pk).update(allocated_at=now - dt.timedelta(hours=2))
    for minutes in (55, 35, 15):
        assert poll_node(node.pk, at=now - dt.timedelta(minutes=minutes)).vgpus == 1

    assert idle.detect_idle(now=now) == {"assessed": 1, "flagged": 1, "cleared": 0, "no_data": 0}
    flag = IdleReservation.objects.get(allocation=allocation)
    assert flag.sm_active_avg == 0
    assert 0 < flag.mem_used_max_mib <= 20 * 1024
    smaller = VGPU_TYPES.get(flag.suggested_profile)
    if flag.proposal == "downsize":  # a smaller type of the same board that holds the peak with headroom
        assert smaller.name.startswith("H100XM-") and smaller.framebuffer_gb < 20
        assert smaller.framebuffer_gb * 1024 >= flag.mem_used_max_mib * idle.HEADROOM
    else:
        assert (flag.proposal, flag.suggested_profile) == ("release", "")


def test_a_busy_vgpu_is_not_flagged(sim, api, bob, operator, project, settings):
    settings.METRICS_INTERVAL_S = 1200
    settings.MONITORING_IDLE_WINDOW_H = 1
    node = _vm_vgpu_node(sim, "H100XM-20C")
    pool = _vgpu_pool(project, operator, bob, api)
    _running_vm(sim, sm_util=60)
    now = timezone.now()
    Allocation.objects.filter(pool=pool).update(allocated_at=now - dt.timedelta(hours=2))
    for minutes in (55, 35, 15):
        poll_node(node.pk, at=now - dt.timedelta(minutes=minutes))
    assert idle.detect_idle(now=now) == {"assessed": 1, "flagged": 0, "cleared": 0, "no_data": 0}

"""Borrowing on a DRA cluster (scenario "dra"): the borrower's claim template admits exactly the lent UUID, its pod
gets that device, and the reclaim evicts it and removes the template (docs/queue.md, Borrowing)."""

from __future__ import annotations

import pytest
from pool_world import kube_for
from test_pools_dra import dra_sim, pod_devices, template_uuids  # noqa: F401, F811  (dra_sim is a fixture)

from pools import lending, services
from pools.models import Allocation, GpuPool
from pools.provisioning import BORROWED_PRIORITY_CLASS, borrowed_template_name, reconcile
from pools.tasks import provision_pool_task

pytestmark = pytest.mark.django_db


def test_a_loan_under_dra_admits_exactly_the_lent_device_until_reclaimed(
    dra_sim,  # noqa: F811
    make_request,
    operator,
    other_project,
    settings,
):
    from simcluster.kube import ClusterApi

    settings.LENDING_RECLAIM_GRACE_S = 0
    pool = services.approve(make_request(count=2), actor=operator)
    assert provision_pool_task(pool.pk) == "active"
    GpuPool.objects.filter(pk=pool.pk).update(lending_enabled=True)  # lending is opt-in
    unit = Allocation.objects.active().filter(pool=pool).order_by("pk").first()
    loan = lending.lend(unit, other_project)
    reconcile(other_project, pool.cluster)  # (dra_sim.cluster predates discovery: binding not refreshed)
    name = borrowed_template_name(loan.pk)
    with kube_for(dra_sim.cluster) as kube:
        assert template_uuids(kube, "team-b", name) == [unit.mig_instance.uuid]
    body = {
        "metadata": {"name": "borrower"},
        "spec": {
            "priorityClassName": BORROWED_PRIORITY_CLASS,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
        },
    }
    with dra_sim.state.lock:
        ClusterApi(dra_sim.sim).create("pods", "team-b", body)
    assert pod_devices(dra_sim, "team-b", "borrower") == [unit.mig_instance.uuid]

    assert lending.reclaim_pool(pool) == 1
    assert lending.reconcile_loans(pool.cluster) == {"reclaiming": 0, "ended": 1, "evicted": 1}
    assert ("team-b", "borrower") not in dra_sim.sim.pods
    with kube_for(dra_sim.cluster) as kube:
        assert [t["metadata"]["name"] for t in kube.list_resource_claim_templates("team-b")] == []
        assert template_uuids(kube, "team-a", f"gpuaas-{pool.pk}-mig-3g.40gb") == sorted(
            Allocation.objects.active().filter(pool=pool).values_list("mig_instance__uuid", flat=True)
        )

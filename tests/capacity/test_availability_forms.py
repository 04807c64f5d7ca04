"""The two ways of asking "is this unit held?" give one answer: the per-row EXISTS forms (a page, an approval's
lock) and the fleet forms (availability.fleet_forms: hashed subqueries for a count over the whole fleet).

A whole GPU is held only by an allocation without a MIG instance: a MIG allocation holds its instance, never the
GPU it sits on. The world has GPU ids unlike MIG instance ids, two clusters and another project's unit."""

import pytest
from pool_world import Fleet

from capacity.models import GpuCapacity, MigInstance
from pools.models import Allocation, GpuPool, PoolRequest
from tenancy.models import Project

pytestmark = pytest.mark.django_db


def _hold(project, gpu, *, mig=None, replica=0):
    request = PoolRequest.objects.create(project=project, name="r", cluster=gpu.node.cluster)
    pool = GpuPool.objects.create(
        project=project, request=request, cluster=gpu.node.cluster, name=f"p{request.pk}", workload_type="inference"
    )
    fields = {"kind": "full", "resource_name": "nvidia.com/gpu", "compute_slices": 7}
    if mig is not None:
        fields = {
            "kind": "mig",
            "mig_instance": mig,
            "resource_name": mig.profile.resource_name,
            "profile_name": mig.profile.name,
            "compute_slices": mig.profile.compute_slices,
        }
    return Allocation.objects.create(
        pool=pool, project=project, gpu=gpu, product=gpu.catalog_product, replica=replica, **fields
    )


def test_a_mig_allocation_holds_its_instance_and_not_its_gpu_in_both_forms():
    fleet = Fleet()
    fleet.full_node("warm-up", gpus=3, cluster="c0")  # GPU ids run ahead of MIG instance ids
    mig_node = fleet.mig_node("c1-mig", [["3g.40gb", "3g.40gb"]], cluster="c1")
    whole_node = fleet.full_node("c2-full", gpus=2, cluster="c2")
    alpha = Project.objects.create(pk=611, name="Alpha", slug="alpha", namespace="team-alpha")
    beta = Project.objects.create(pk=612, name="Beta", slug="beta", namespace="team-beta")
    held_instance, free_instance = MigInstance.objects.filter(gpu__node=mig_node).order_by("placement_start")
    held_gpu, free_gpu = whole_node.gpus.order_by("index")
    _hold(alpha, held_instance.gpu, mig=held_instance)
    _hold(beta, held_gpu)

    def reserved(queryset, fleet):
        return dict(queryset.annotate_availability(fleet=fleet).values_list("pk", "reserved"))

    gpus = GpuCapacity.objects.filter(node__in=[mig_node, whole_node])
    assert (
        reserved(gpus, fleet=True)
        == reserved(gpus, fleet=False)
        == {
            held_instance.gpu_id: False,  # the MIG GPU: its instance is held, not the GPU
            held_gpu.pk: True,
            free_gpu.pk: False,
        }
    )
    instances = MigInstance.objects.filter(gpu__node=mig_node)
    assert (
        reserved(instances, fleet=True)
        == reserved(instances, fleet=False)
        == {
            held_instance.pk: True,
            free_instance.pk: False,
        }
    )

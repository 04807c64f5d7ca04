"""Billing fixtures: the smallest capacity rows an Allocation needs, made by one factory."""

from __future__ import annotations

import itertools

import pytest
from billing_helpers import at


@pytest.fixture
def allocate(db):
    """allocate(project, start, end=None, kind="full", product="H100-80GB", profile="", ...) -> Allocation.

    Creates a cluster/node/GPU, an approved request and its pool (one per call unless `pool` is
    given), and one allocation whose clock runs from `start` to `end`. The pool's provisioning
    completed at approval when it is active or released (`provisioned`: a time, or None for never).
    """
    from capacity.models import Cluster, GpuCapacity, MigInstance, MigProfile, NodeCapacity
    from pools.models import Allocation, GpuPool, PoolRequest

    counter = itertools.count(1)
    cluster = Cluster.objects.create(name="billing", kubeconfig_path="/dev/null")
    node = NodeCapacity.objects.create(cluster=cluster, name="node-1", gpu_count=8, timeslice_replicas=4)

    def make(
        project,
        start,
        end=None,
        *,
        kind="full",
        product="H100-80GB",
        profile="",
        pool=None,
        gpu=None,
        request_state="active",
        pool_state="active",
        request_end=None,
        provisioned="approval",
    ):
        n = next(counter)
        start = at(start) if isinstance(start, str) else start
        end = at(end) if isinstance(end, str) else end
        if gpu is None:
            gpu = GpuCapacity.objects.create(
                node=node, index=n, uuid=f"GPU-{n}", product="NVIDIA H100 80GB HBM3", catalog_product=product
            )
        if pool is None:
            request = PoolRequest.objects.create(
                project=project,
                spec_kind=kind,
                product=product,
                profile_name=profile,
                start_at=start,
                end_at=request_end,
                approved_at=start,
            )
            PoolRequest.objects.filter(pk=request.pk).update(state=request_state)
            pool = GpuPool.objects.create(
                project=project, request=request, cluster=cluster, name=f"pool-{n}", workload_type="inference"
            )
            # Provisioning completed at approval unless told otherwise (None: never completed).
            provisioned_at = start if provisioned == "approval" and pool_state in ("active", "released") else None
            if isinstance(provisioned, str) and provisioned != "approval":
                provisioned_at = at(provisioned)
            GpuPool.objects.filter(pk=pool.pk).update(state=pool_state, provisioned_at=provisioned_at)
        mig = None
        slices = 7
        if kind == "mig":
            mig_profile = MigProfile.objects.get(product=product, name=profile)
            placement = mig_profile.valid_placements.order_by("start").first()
            mig = MigInstance.objects.create(
                gpu=gpu,
                profile=mig_profile,
                placement=placement,
                placement_start=placement.start,
                placement_size=placement.size,
                uuid=f"MIG-{n}",
            )
            slices = mig_profile.compute_slices
        return Allocation.objects.create(
            pool=pool,
            project=project,
            kind=kind,
            gpu=gpu,
            mig_instance=mig,
            replica=n if kind == "timeslice" else 0,
            resource_name="nvidia.com/gpu",
            product=product,
            profile_name=profile,
            compute_slices=slices,
            allocated_at=start,
            released_at=end,
        )

    return make

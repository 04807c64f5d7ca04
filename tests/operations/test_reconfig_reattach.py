"""Verify re-points MIG allocations whose instance was recreated at the same placement (through pools)."""

import pytest
from reconfig_sim import allocate, gpu_row, node_row, start_sim

from capacity.choices import MigInstanceState
from capacity.models import MigInstance
from operations import reconfiguration as rc
from operations.reconfiguration.steps import reattach_allocations
from pools.services import move_mig_allocation

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 1, {0: ["3g.40gb", "3g.40gb"]}, "")])
    yield sim
    sim.server.stop()


def _recreate(instance: MigInstance) -> MigInstance:
    """What rediscovery records after the MIG manager destroyed and recreated an instance in place."""
    MigInstance.objects.filter(pk=instance.pk).update(state=MigInstanceState.GONE)
    return MigInstance.objects.create(
        gpu=instance.gpu,
        profile=instance.profile,
        placement=instance.placement,
        placement_start=instance.placement_start,
        placement_size=instance.placement_size,
        uuid=f"{instance.uuid}-new",
    )


def test_an_allocation_follows_its_recreated_instance(sim):
    allocation = allocate(gpu_row("gpu-a", 0), mig_start=4)
    old = allocation.mig_instance
    reconf = rc.create(node_row("gpu-a"), {"0": ["3g.40gb", "3g.40gb"]}, backend="operator", force=True)
    new = _recreate(old)

    notes = reattach_allocations(reconf)

    allocation.refresh_from_db()
    assert allocation.mig_instance_id == new.pk
    assert notes == [
        f"allocation #{allocation.pk} moved from the destroyed 3g.40gb at 4 on GPU {old.gpu.uuid} to the 3g.40gb at 4"
    ]
    assert list(reconf.steps.filter(step="verify", event="info").values_list("message", flat=True)) == notes


def test_an_allocation_moves_to_the_same_profile_at_another_start(sim):
    """mig-parted may recreate the profile elsewhere on the GPU: the reservation follows it."""
    allocation = allocate(gpu_row("gpu-a", 0), mig_start=4)
    old = allocation.mig_instance
    reconf = rc.create(node_row("gpu-a"), {"0": ["3g.40gb", "3g.40gb"]}, backend="operator", force=True)
    MigInstance.objects.filter(pk=old.pk).update(state=MigInstanceState.GONE)
    other = MigInstance.objects.active().get(gpu=old.gpu, placement_start=0)

    reattach_allocations(reconf)

    allocation.refresh_from_db()
    assert (allocation.mig_instance_id, allocation.released_at) == (other.pk, None)


def test_an_allocation_without_an_equivalent_instance_ends(sim):
    allocation = allocate(gpu_row("gpu-a", 0), mig_start=4)
    allocate(gpu_row("gpu-a", 0), mig_start=0)  # the other 3g.40gb is held: no free equivalent
    old = allocation.mig_instance
    reconf = rc.create(node_row("gpu-a"), {"0": ["3g.40gb", "3g.40gb"]}, backend="operator", force=True)
    MigInstance.objects.filter(pk=old.pk).update(state=MigInstanceState.GONE)

    notes = reattach_allocations(reconf)

    allocation.refresh_from_db()
    assert allocation.mig_instance_id == old.pk
    assert allocation.released_at is not None
    assert allocation.end_reason.startswith(f"MIG instance 3g.40gb at 4 on GPU {old.gpu.uuid} destroyed at ")
    assert notes == [f"allocation #{allocation.pk} ended: {allocation.end_reason}"]


def test_move_mig_allocation_claims_the_move(sim):
    allocation = allocate(gpu_row("gpu-a", 0), mig_start=4)
    old = allocation.mig_instance
    other = MigInstance.objects.active().get(gpu=old.gpu, placement_start=0)
    new = _recreate(old)

    assert move_mig_allocation(allocation, from_instance=other, to_instance=new) is False  # it holds `old`
    allocation.refresh_from_db()
    assert allocation.mig_instance_id == old.pk
    assert move_mig_allocation(allocation, from_instance=old, to_instance=new) is True
    allocation.refresh_from_db()
    assert allocation.mig_instance_id == new.pk

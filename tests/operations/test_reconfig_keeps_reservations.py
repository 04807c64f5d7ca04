"""A reconfiguration with drain over reserved instances: each allocation moves to an equivalent instance or
ends at the second its instance was destroyed (billing stops there); none stays on a destroyed instance."""

from datetime import timedelta

import pytest
from reconfig_sim import allocate, drive, gpu_row, node_row, start_sim

from billing.choices import LineType
from billing.models import UsageRecord
from billing.periods import floor_hour, month_start
from billing.services import generate_statement
from billing.services.metering import meter_usage
from capacity.choices import MigInstanceState
from operations import reconfiguration as rc
from pools.models import Allocation, GpuPool
from pricing.services import seed_default_card

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = start_sim(tmp_path, [("gpu-a", "H100-80GB", 1, {0: ["3g.40gb", "3g.40gb"]}, "")])
    yield sim
    sim.server.stop()


def _billed(allocation, *, hours_ago: int):
    """Backdate the allocation and mark its pool provisioned, so metering bills it."""
    start = floor_hour(allocation.allocated_at) - timedelta(hours=hours_ago)
    Allocation.objects.filter(pk=allocation.pk).update(allocated_at=start)
    GpuPool.objects.filter(pk=allocation.pool_id).update(state="active", provisioned_at=start)
    return start


@pytest.mark.parametrize("backend", ["agent", "operator"])
def test_drain_leaves_no_allocation_on_a_destroyed_instance_and_bills_nothing_after(sim, backend):
    seed_default_card()
    kept = allocate(gpu_row("gpu-a", 0), mig_start=4)
    lost = allocate(gpu_row("gpu-a", 0), mig_start=0)
    start = _billed(lost, hours_ago=2)
    _billed(kept, hours_ago=2)

    reconf = rc.create(
        node_row("gpu-a"), {"0": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}, backend=backend, drain=True, force=True
    )
    drive(sim, reconf)
    assert reconf.state == "succeeded", reconf.error

    on_destroyed = Allocation.objects.active().exclude(mig_instance__state=MigInstanceState.ACTIVE)
    assert not on_destroyed.exists()
    kept.refresh_from_db()
    lost.refresh_from_db()
    # One 3g.40gb survives the new layout: one reservation holds it, the other ended with its reason.
    survivors = [a for a in (kept, lost) if a.released_at is None]
    ended = [a for a in (kept, lost) if a.released_at is not None]
    assert len(survivors) == 1 and len(ended) == 1
    assert survivors[0].mig_instance.state == MigInstanceState.ACTIVE
    assert survivors[0].mig_instance.profile.name == "3g.40gb"
    gone = ended[0]
    assert "destroyed at" in gone.end_reason and "no equivalent instance left" in gone.end_reason
    assert gone.pool.shortfall == 1

    destroyed_at = gone.released_at
    meter_usage(until=floor_hour(destroyed_at) + timedelta(hours=3))
    records = UsageRecord.objects.filter(allocation=gone)
    assert sum(r.seconds for r in records) == int((destroyed_at - start).total_seconds())
    assert not records.filter(hour__gt=floor_hour(destroyed_at)).exists()
    statement = generate_statement(gone.project, month_start(destroyed_at.date()))
    (notice,) = statement.lines.filter(line_type=LineType.NOTICE)
    assert (notice.amount, notice.reason, notice.pool_id) == (0, gone.end_reason, gone.pool_id)

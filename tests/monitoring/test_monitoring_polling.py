"""NVML polling by the node agent against the simulator's fake NVML (pynvml's own code, simulated driver).

What NVML cannot give (utilisation on a MIG-enabled GPU, GPM on Ampere) is stored as NULL, never 0;
a lost GPU writes no sample and raises a critical event.
"""

from datetime import timedelta

import pytest
from monitoring_sim import start

from capacity.choices import GpuHealth
from monitoring.models import Collector, HealthEvent, Sample, Series
from monitoring.services.reports import poll_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def sim(tmp_path):
    sim = start(tmp_path)
    yield sim
    sim.server.stop()


def _sample(gpu, mig=None, ts=None):
    query = Sample.objects.filter(series__gpu=gpu, series__mig_instance=mig)
    if ts is not None:
        query = query.filter(ts=ts)
    return query.get()


def test_a_hopper_node_poll_records_gpus_and_mig_instances(sim):
    node = sim.node("h100-01")
    result = poll_node(node.pk)
    assert (result.gpus, result.mig_instances, result.samples, result.lost, result.unknown) == (2, 3, 5, 0, [])
    mig_gpu, full_gpu = sim.gpu("h100-01", 0), sim.gpu("h100-01", 1)

    parent = _sample(mig_gpu)
    assert parent.gpu_util is None  # NotSupported on a MIG-enabled GPU: unavailable, not zero
    assert parent.power_w > 0 and parent.energy_mj > 0 and parent.temp_c > 0
    assert (parent.ecc_sbe_vol, parent.ecc_dbe_vol, parent.ecc_sbe_agg, parent.ecc_dbe_agg) == (0, 0, 0, 0)
    assert (parent.remap_corr, parent.remap_unc, parent.remap_pending, parent.remap_failure) == (0, 0, False, False)
    assert parent.retired_pages is None  # row remapping replaced page retirement
    assert parent.xid == 0  # XID events are watched: none so far
    assert parent.sm_active is not None

    for profile in ("3g.40gb", "2g.20gb", "1g.10gb"):
        instance = sim.instance("h100-01", profile)
        row = _sample(mig_gpu, instance)
        assert 0.0 <= row.sm_active <= 100.0, profile  # GPM per GPU instance (parent handle + GI id)
        assert row.mem_used_mib is not None and row.power_w is None
        assert Series.objects.get(mig_instance=instance).mem_total_mib == instance.profile.memory_mib

    full = _sample(full_gpu)
    assert full.gpu_util is not None and full.sm_active is not None
    assert Series.objects.get(gpu=full_gpu, mig_instance=None).mem_total_mib == 81559
    collector = Collector.objects.get(target="h100-01")
    assert (collector.last_error, collector.last_samples) == ("", 5)


def test_gpm_on_ampere_is_unavailable_not_zero(sim):
    result = poll_node(sim.node("a100-01").pk)
    assert (result.gpus, result.mig_instances) == (1, 2)
    gpu = sim.gpu("a100-01", 0)
    assert _sample(gpu).sm_active is None  # no GPM, and no instance value to derive it from
    assert _sample(gpu).gpu_util is None
    rows = Sample.objects.filter(series__gpu=gpu, series__mig_instance__isnull=False)
    assert [(r.sm_active, r.mem_used_mib is not None) for r in rows] == [(None, True), (None, True)]


def test_a_repeated_poll_in_the_same_period_writes_nothing_new(sim):
    node = sim.node("h100-01")
    first = poll_node(node.pk)
    sim.state.tick(5)
    poll_node(node.pk, at=Sample.objects.first().ts + timedelta(seconds=10))
    assert Sample.objects.count() == first.samples


def test_a_lost_gpu_writes_no_sample_and_is_critical(sim):
    node = sim.node("h100-01")
    poll_node(node.pk)  # registers the XID watcher
    sim.faults.gpu_lost(sim.name, "h100-01", 1)
    ts = Sample.objects.first().ts + timedelta(seconds=30)
    result = poll_node(node.pk, at=ts)
    assert (result.lost, result.gpus) == (1, 1)
    full_gpu = sim.gpu("h100-01", 1)
    assert not Sample.objects.filter(series__gpu=full_gpu, ts=ts).exists()
    assert sorted(HealthEvent.objects.open().filter(gpu=full_gpu).values_list("rule", "value")) == [
        ("gpu_lost", None),
        ("xid_critical", 79),
    ]
    full_gpu.refresh_from_db()
    assert full_gpu.health == GpuHealth.UNHEALTHY


def test_faults_raise_events_on_the_right_unit(sim):
    node = sim.node("h100-01")
    poll_node(node.pk)
    t0 = Sample.objects.first().ts
    gi_2g = sim.instance("h100-01", "2g.20gb").gi_id
    sim.faults.xid(sim.name, "h100-01", 0, code=43, gpu_instance=gi_2g)
    sim.faults.ecc_double_bit(sim.name, "h100-01", 1, count=2)
    sim.faults.thermal_throttle(sim.name, "h100-01", 1)
    sim.faults.row_remap_pending(sim.name, "h100-01", 0)
    sim.state.tick(30)
    poll_node(node.pk, at=t0 + timedelta(seconds=30))
    events = sorted(
        (e.gpu.index, e.mig_instance.profile.name if e.mig_instance else "-", e.rule, e.level)
        for e in HealthEvent.objects.open().select_related("gpu", "mig_instance__profile")
    )
    assert events == [
        (0, "-", "remap_pending", "warning"),
        (0, "2g.20gb", "xid_warning", "warning"),
        (1, "-", "ecc_dbe", "critical"),
        (1, "-", "thermal_throttle", "warning"),
    ]
    assert _sample(sim.gpu("h100-01", 1), ts=t0 + timedelta(seconds=30)).ecc_dbe_vol == 2
    assert _sample(sim.gpu("h100-01", 0), sim.instance("h100-01", "2g.20gb"), ts=t0 + timedelta(seconds=30)).xid == 43

    sim.faults.reset()
    sim.state.tick(30)
    poll_node(node.pk, at=t0 + timedelta(minutes=5))  # past the throttle hold, not the XID quiet period
    assert sorted(HealthEvent.objects.open().values_list("rule", flat=True)) == ["xid_warning"]
    assert sim.gpu("h100-01", 1).health == GpuHealth.OK

"""Activity on an unallocated unit: sustained over MONITORING_TRESPASS_POLLS polls, memory counted beyond what the
driver itself holds on an idle unit of that product and profile (learned from NVML polls, not a constant)."""

from datetime import timedelta

import pytest
from django.utils import timezone
from monitoring_helpers import series_of, write

from monitoring.models import IdleMemory, TrespassEvent
from monitoring.services.collect import UnitSample
from monitoring.services.idle_memory import learn_idle_memory
from monitoring.services.trespass import detect_trespass

pytestmark = pytest.mark.django_db


def _poll(fleet, at, **values) -> None:
    write(series_of(fleet.full_gpu), at, **values)


def test_one_busy_sample_is_no_trespass_and_the_window_opens_exactly_one_event(fleet, settings):
    settings.MONITORING_TRESPASS_POLLS = 3
    start = timezone.now().replace(microsecond=0) - timedelta(minutes=10)
    polls = [start + timedelta(seconds=30 * k) for k in range(6)]
    _poll(fleet, polls[0], sm_active=0.0, mem_used_mib=0)
    _poll(fleet, polls[1], sm_active=60.0, mem_used_mib=0)  # one sample: a probe, not a tenant
    _poll(fleet, polls[2], sm_active=0.0, mem_used_mib=0)
    for at in polls[:3]:
        assert detect_trespass(fleet.cluster.pk, at=at).findings == []

    for at in polls[3:]:
        _poll(fleet, at, sm_active=60.0, mem_used_mib=0)
        detect_trespass(fleet.cluster.pk, at=at)
        opened = list(TrespassEvent.objects.values_list("kind", "started_at"))
        if at < polls[5]:
            assert opened == []  # 1 and 2 busy polls in a row
    assert opened == [("unallocated_activity", polls[5])]  # the third poll in a row, and only one event


def test_the_drivers_own_memory_is_learned_from_idle_units_and_discounted(fleet, settings):
    settings.MONITORING_TRESPASS_POLLS = 1
    settings.MONITORING_TRESPASS_MEM_MIB = 256
    now = timezone.now()
    # A process-free H100 read 455 MiB in use (an idle one, recorded, reads 454 reserved + 1 used): learned.
    idle = UnitSample(fleet.full_gpu.pk, None, {"mem_used_mib": 455}, idle_kind=("H100-80GB", ""))
    busy = UnitSample(fleet.mig_gpu.pk, None, {"mem_used_mib": 9000})  # processes on it: not a baseline
    assert learn_idle_memory([idle, busy], at=now) == 1
    assert list(IdleMemory.objects.values_list("product", "profile_name", "mem_used_mib")) == [("H100-80GB", "", 455)]

    _poll(fleet, now, sm_active=0.0, mem_used_mib=512)  # the driver's 455 plus 57: no tenant
    assert detect_trespass(fleet.cluster.pk, at=now).findings == []

    later = now + timedelta(seconds=30)
    _poll(fleet, later, sm_active=0.0, mem_used_mib=455 + 300)  # 300 MiB beyond the driver's own
    (finding,) = detect_trespass(fleet.cluster.pk, at=later).findings
    assert (finding.kind, finding.mem_used_mib) == ("unallocated_activity", 755)


def test_without_a_learned_baseline_the_raw_reading_counts(fleet, settings):
    settings.MONITORING_TRESPASS_POLLS = 1
    now = timezone.now()
    _poll(fleet, now, sm_active=0.0, mem_used_mib=512)
    assert [f.kind for f in detect_trespass(fleet.cluster.pk, at=now).findings] == ["unallocated_activity"]


def test_a_changed_reservation_is_followed_and_a_steady_one_writes_nothing(fleet):
    now = timezone.now()
    sample = UnitSample(fleet.full_gpu.pk, None, {"mem_used_mib": 455}, idle_kind=("H100-80GB", ""))
    assert learn_idle_memory([sample], at=now) == 1
    assert learn_idle_memory([sample], at=now) == 0
    sample.values["mem_used_mib"] = 470  # a driver upgrade reserves more
    assert learn_idle_memory([sample], at=now + timedelta(minutes=1)) == 1
    assert IdleMemory.objects.get().mem_used_mib == 470

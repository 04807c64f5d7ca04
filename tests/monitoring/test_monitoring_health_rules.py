"""Health rules: each rule fires and clears; GPU health follows; unavailable data changes nothing."""

from datetime import timedelta
from unittest import mock

import pytest
from monitoring_helpers import T0

from capacity.choices import GpuHealth
from monitoring.choices import HealthLevel, HealthRule
from monitoring.health import Reading
from monitoring.models import HealthEvent
from monitoring.services.health import UnitHealth, apply_health, resolve_events
from scheduling.tasks import process_queue_task

pytestmark = pytest.mark.django_db


def _apply(gpu, reading, at=T0, mig=None):
    return apply_health([UnitHealth(gpu.pk, mig.pk if mig else None, reading)], at=at)


def _health(gpu):
    gpu.refresh_from_db()
    return gpu.health


def test_double_bit_ecc_is_critical_and_makes_the_gpu_unhealthy_until_reset(fleet):
    outcome = _apply(fleet.full_gpu, Reading(ecc_dbe_vol=2))
    event = HealthEvent.objects.get()
    assert (event.rule, event.level, event.value, event.opened_at) == (HealthRule.ECC_DBE, "critical", 2, T0)
    assert event.message == "2 uncorrected ECC error(s) since reset"
    assert outcome.newly_unhealthy == [fleet.full_gpu.pk]
    assert _health(fleet.full_gpu) == GpuHealth.UNHEALTHY

    _apply(fleet.full_gpu, Reading(ecc_dbe_vol=3), at=T0 + timedelta(seconds=30))
    event.refresh_from_db()
    assert (event.occurrences, event.value, event.last_seen_at) == (2, 3, T0 + timedelta(seconds=30))
    assert HealthEvent.objects.count() == 1

    _apply(fleet.full_gpu, Reading(ecc_dbe_vol=None), at=T0 + timedelta(seconds=60))  # unavailable: no change
    assert HealthEvent.objects.open().count() == 1

    _apply(fleet.full_gpu, Reading(ecc_dbe_vol=0), at=T0 + timedelta(seconds=90))  # after a reset
    event.refresh_from_db()
    assert event.resolved_at == T0 + timedelta(seconds=90)
    assert _health(fleet.full_gpu) == GpuHealth.OK


def test_critical_xid_clears_after_a_quiet_period(fleet, settings):
    settings.MONITORING_XID_CLEAR_S = 600
    _apply(fleet.full_gpu, Reading(xids=[79]))
    event = HealthEvent.objects.get()
    assert (event.rule, event.level, event.value) == (HealthRule.XID_CRITICAL, "critical", 79)
    assert event.message == "XID 79: GPU has fallen off the bus"
    _apply(fleet.full_gpu, Reading(xids=[]), at=T0 + timedelta(seconds=599))
    assert HealthEvent.objects.open().count() == 1
    _apply(fleet.full_gpu, Reading(xids=[]), at=T0 + timedelta(seconds=600))
    assert HealthEvent.objects.open().count() == 0
    assert _health(fleet.full_gpu) == GpuHealth.OK


def test_application_xids_are_warnings_and_unknown_codes_are_ignored(fleet):
    _apply(fleet.full_gpu, Reading(xids=[13, 45]))
    event = HealthEvent.objects.get()
    assert (event.rule, event.level, event.value) == (HealthRule.XID_WARNING, HealthLevel.WARNING, 13)
    assert _health(fleet.full_gpu) == GpuHealth.WARNING


def test_xid_on_a_mig_instance_is_recorded_on_that_instance(fleet):
    _apply(fleet.mig_gpu, Reading(xids=[43]), mig=fleet.mig_2g)
    event = HealthEvent.objects.get()
    assert (event.gpu_id, event.mig_instance_id, event.rule) == (fleet.mig_gpu.pk, fleet.mig_2g.pk, "xid_warning")


def test_row_remap_pending_warns_and_failure_is_critical(fleet):
    _apply(fleet.full_gpu, Reading(remap_pending=True, remap_failure=False))
    assert list(HealthEvent.objects.open().values_list("rule", "level")) == [("remap_pending", "warning")]
    _apply(fleet.full_gpu, Reading(remap_pending=False, remap_failure=True), at=T0 + timedelta(seconds=30))
    assert list(HealthEvent.objects.open().values_list("rule", "level")) == [("remap_failure", "critical")]
    assert HealthEvent.objects.get(rule="remap_pending").resolved_at == T0 + timedelta(seconds=30)
    assert _health(fleet.full_gpu) == GpuHealth.UNHEALTHY
    _apply(fleet.full_gpu, Reading(remap_pending=False, remap_failure=False), at=T0 + timedelta(seconds=60))
    assert HealthEvent.objects.open().count() == 0
    assert _health(fleet.full_gpu) == GpuHealth.OK


def test_thermal_and_power_throttling_warn_and_clear_after_a_hold(fleet, settings):
    settings.MONITORING_THROTTLE_CLEAR_S = 120
    _apply(fleet.full_gpu, Reading(throttle=0x40 | 0x80))  # HW thermal + HW power brake
    assert sorted(HealthEvent.objects.open().values_list("rule", flat=True)) == ["power_throttle", "thermal_throttle"]
    assert _health(fleet.full_gpu) == GpuHealth.WARNING
    _apply(fleet.full_gpu, Reading(throttle=0x4), at=T0 + timedelta(seconds=60))  # SW power cap only: normal
    assert HealthEvent.objects.open().count() == 2
    _apply(fleet.full_gpu, Reading(throttle=0x1), at=T0 + timedelta(seconds=120))
    assert HealthEvent.objects.open().count() == 0
    assert _health(fleet.full_gpu) == GpuHealth.OK


def test_a_lost_gpu_is_critical_until_it_reads_again(fleet):
    _apply(fleet.full_gpu, Reading(lost=True))
    event = HealthEvent.objects.get()
    assert (event.rule, event.level) == (HealthRule.GPU_LOST, "critical")
    assert _health(fleet.full_gpu) == GpuHealth.UNHEALTHY
    _apply(fleet.full_gpu, Reading(ecc_dbe_vol=0), at=T0 + timedelta(seconds=30))
    event.refresh_from_db()
    assert event.resolved_at == T0 + timedelta(seconds=30)
    assert _health(fleet.full_gpu) == GpuHealth.OK


def test_discovery_owns_lost(fleet):
    type(fleet.full_gpu).objects.filter(pk=fleet.full_gpu.pk).update(health=GpuHealth.LOST)
    _apply(fleet.full_gpu, Reading(ecc_dbe_vol=1))
    assert _health(fleet.full_gpu) == GpuHealth.LOST


def test_a_mig_level_critical_event_marks_the_parent_gpu(fleet):
    _apply(fleet.mig_gpu, Reading(xids=[94]), mig=fleet.mig_1g)
    assert _health(fleet.mig_gpu) == GpuHealth.UNHEALTHY


def test_operator_resolution_and_recurrence(fleet, operator):
    _apply(fleet.full_gpu, Reading(ecc_dbe_vol=1))
    event = HealthEvent.objects.get()
    assert resolve_events([event.pk], actor=operator, note="GPU reset", at=T0 + timedelta(minutes=1)) == 1
    event.refresh_from_db()
    assert (event.resolved_by, event.resolution) == (operator, "GPU reset")
    assert _health(fleet.full_gpu) == GpuHealth.OK
    assert resolve_events([event.pk], actor=operator) == 0
    _apply(fleet.full_gpu, Reading(ecc_dbe_vol=1), at=T0 + timedelta(minutes=2))  # still there: a new event
    assert HealthEvent.objects.count() == 2
    assert HealthEvent.objects.open().get().opened_at == T0 + timedelta(minutes=2)


def test_critical_gpu_cordons_its_node_after_commit_when_configured(
    fleet, settings, django_capture_on_commit_callbacks
):
    settings.MONITORING_CORDON_ON_CRITICAL = True
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        _apply(fleet.full_gpu, Reading(ecc_dbe_vol=1))
    assert len(callbacks) == 1


def test_no_cordon_by_default(fleet, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        _apply(fleet.full_gpu, Reading(ecc_dbe_vol=1))
    assert callbacks == []


def test_a_gpu_whose_health_clears_gets_the_queue_a_pass_after_commit(
    fleet, operator, settings, django_capture_on_commit_callbacks
):
    settings.MONITORING_CORDON_ON_CRITICAL = False
    with mock.patch.object(process_queue_task, "delay") as delay:
        with django_capture_on_commit_callbacks(execute=True):
            _apply(fleet.full_gpu, Reading(ecc_dbe_vol=1))  # unhealthy: nothing freed
        assert delay.call_count == 0
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            resolve_events([HealthEvent.objects.get().pk], actor=operator)
        assert delay.call_count == 0  # not before commit
        for callback in callbacks:
            callback()
    assert delay.call_count == 1

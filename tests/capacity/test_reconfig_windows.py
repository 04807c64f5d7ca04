"""Maintenance windows: weekly (also past midnight) and one-off, per cluster or node group."""

import datetime as dt

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError

from capacity.models import Cluster, MaintenanceWindow, NodeCapacity

pytestmark = pytest.mark.django_db

UTC = dt.UTC


@pytest.fixture
def cluster():
    return Cluster.objects.create(name="lab", kubeconfig_path="/dev/null")


def at(day, hour, minute=0):
    return dt.datetime(2026, 12, day, hour, minute, tzinfo=UTC)  # 2026-12-07 is a Monday


def test_weekly_window(cluster):
    window = MaintenanceWindow(cluster=cluster, weekday=1, start_time=dt.time(2), end_time=dt.time(4))  # Tuesday
    assert window.is_open(at(8, 2)) is True
    assert window.is_open(at(8, 3, 59)) is True
    assert window.is_open(at(8, 4)) is False
    assert window.is_open(at(7, 3)) is False
    assert window.next_opening(at(8, 5)) == (at(15, 2), at(15, 4))
    assert window.next_opening(at(8, 3)) == (at(8, 2), at(8, 4))
    assert window.schedule_label == "weekly Tue 02:00-04:00 UTC"


def test_weekly_window_past_midnight(cluster):
    window = MaintenanceWindow(cluster=cluster, weekday=6, start_time=dt.time(22), end_time=dt.time(2))  # Sun night
    assert window.is_open(at(13, 23)) is True
    assert window.is_open(at(14, 1, 30)) is True  # Monday morning, the window opened on Sunday
    assert window.is_open(at(14, 2)) is False


def test_one_off_window(cluster):
    window = MaintenanceWindow(cluster=cluster, starts_at=at(10, 8), ends_at=at(10, 12))
    assert window.is_open(at(10, 9)) is True
    assert window.is_open(at(10, 12)) is False
    assert window.next_opening(at(9, 0)) == (at(10, 8), at(10, 12))
    assert window.next_opening(at(11, 0)) is None


def test_windows_apply_to_their_group_or_the_whole_cluster(cluster):
    node = NodeCapacity.objects.create(cluster=cluster, name="gpu-a", node_group="dev")
    everywhere = MaintenanceWindow.objects.create(cluster=cluster, starts_at=at(10, 8), ends_at=at(10, 9))
    dev = MaintenanceWindow.objects.create(cluster=cluster, node_group="dev", starts_at=at(11, 8), ends_at=at(11, 9))
    MaintenanceWindow.objects.create(cluster=cluster, node_group="prod", starts_at=at(12, 8), ends_at=at(12, 9))
    MaintenanceWindow.objects.create(cluster=cluster, starts_at=at(13, 8), ends_at=at(13, 9), enabled=False)
    assert list(MaintenanceWindow.objects.for_node(node).order_by("starts_at")) == [everywhere, dev]


def test_a_window_is_weekly_or_one_off(cluster):
    with pytest.raises(ValidationError):
        MaintenanceWindow(
            cluster=cluster, weekday=1, start_time=dt.time(2), end_time=dt.time(4), starts_at=at(1, 1), ends_at=at(1, 2)
        ).full_clean()
    with pytest.raises(ValidationError):
        MaintenanceWindow(cluster=cluster, weekday=1).full_clean()
    with pytest.raises(ValidationError):
        MaintenanceWindow(cluster=cluster, starts_at=at(2, 2), ends_at=at(2, 1)).full_clean()
    with pytest.raises(IntegrityError):
        MaintenanceWindow.objects.create(cluster=cluster, weekday=1, start_time=dt.time(2))

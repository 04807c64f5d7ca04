"""Maintenance windows: when nodes may be disrupted."""

from __future__ import annotations

import datetime as _dt

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from .clusters import Cluster


class MaintenanceWindowQuerySet(models.QuerySet):
    def enabled(self):
        return self.filter(enabled=True)

    def for_node(self, node):
        """Windows that apply to `node`: its cluster's windows for every group or for the node's group."""
        scope = Q(node_group="") | Q(node_group=node.node_group)
        return self.enabled().filter(cluster_id=node.cluster_id).filter(scope)

    def open_at(self, at=None) -> list:
        at = at or timezone.now()
        return [w for w in self if w.is_open(at)]


class MaintenanceWindow(models.Model):
    """When nodes of a cluster (or of one node group) may be disrupted, in UTC.

    Weekly (weekday + start/end time; an end before the start runs past midnight) or one-off
    (starts_at/ends_at). MIG reconfigurations run only inside an open window unless forced.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="maintenance_windows")
    node_group = models.CharField(max_length=100, blank=True, help_text="Empty = every node of the cluster.")
    name = models.CharField(max_length=100, blank=True)
    weekday = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(6)], help_text="0 = Monday … 6 = Sunday (weekly)."
    )
    start_time = models.TimeField(null=True, blank=True, help_text="Weekly: opens at (UTC).")
    end_time = models.TimeField(null=True, blank=True, help_text="Weekly: closes at (UTC); before start = next day.")
    starts_at = models.DateTimeField(null=True, blank=True, help_text="One-off: opens at.")
    ends_at = models.DateTimeField(null=True, blank=True, help_text="One-off: closes at.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = MaintenanceWindowQuerySet.as_manager()

    class Meta:
        ordering = ["cluster_id", "node_group", "weekday", "start_time", "starts_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(
                        weekday__isnull=False,
                        start_time__isnull=False,
                        end_time__isnull=False,
                        starts_at__isnull=True,
                        ends_at__isnull=True,
                    )
                    | Q(
                        weekday__isnull=True,
                        start_time__isnull=True,
                        end_time__isnull=True,
                        starts_at__isnull=False,
                        ends_at__isnull=False,
                        ends_at__gt=models.F("starts_at"),
                    )
                ),
                name="capacity_maintenancewindow_weekly_or_oneoff",
            ),
        ]

    def __str__(self) -> str:
        scope = f"{self.cluster}/{self.node_group}" if self.node_group else str(self.cluster)
        return f"{scope}: {self.schedule_label}"

    @property
    def is_weekly(self) -> bool:
        return self.weekday is not None

    @property
    def schedule_label(self) -> str:
        if self.is_weekly:
            day = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"][self.weekday]
            return f"weekly {day} {self.start_time:%H:%M}-{self.end_time:%H:%M} UTC"
        return f"{self.starts_at:%Y-%m-%d %H:%M} - {self.ends_at:%Y-%m-%d %H:%M} UTC"

    def clean(self) -> None:
        weekly = [self.weekday, self.start_time, self.end_time]
        oneoff = [self.starts_at, self.ends_at]
        if any(v is not None for v in weekly) and any(v is not None for v in oneoff):
            raise ValidationError("Give either a weekly window (weekday, start, end) or a one-off one, not both.")
        if any(v is not None for v in weekly):
            if any(v is None for v in weekly):
                raise ValidationError({"weekday": "A weekly window needs a weekday, a start time and an end time."})
            if self.start_time == self.end_time:
                raise ValidationError({"end_time": "The window must not be empty."})
        elif all(v is not None for v in oneoff):
            if self.ends_at <= self.starts_at:
                raise ValidationError({"ends_at": "The end must be after the start."})
        else:
            raise ValidationError("Give a weekly window (weekday, start, end) or a one-off one (start and end).")

    def occurrences(self, around: _dt.datetime):
        """(opens, closes) intervals near `around` (the week before and after, for weekly windows)."""
        if not self.is_weekly:
            return [(self.starts_at, self.ends_at)]
        utc = around.astimezone(_dt.UTC)
        monday = (utc - _dt.timedelta(days=utc.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)
        out = []
        for week in (-1, 0, 1):
            day = monday + _dt.timedelta(days=7 * week + self.weekday)
            opens = day.replace(hour=self.start_time.hour, minute=self.start_time.minute, second=self.start_time.second)
            closes = day.replace(hour=self.end_time.hour, minute=self.end_time.minute, second=self.end_time.second)
            if closes <= opens:
                closes += _dt.timedelta(days=1)
            out.append((opens, closes))
        return out

    def is_open(self, at: _dt.datetime | None = None) -> bool:
        at = at or timezone.now()
        return any(opens <= at < closes for opens, closes in self.occurrences(at))

    def next_opening(self, after: _dt.datetime | None = None) -> tuple[_dt.datetime, _dt.datetime] | None:
        """The (opens, closes) interval that is open at `after` or opens next; None if none is left."""
        after = after or timezone.now()
        for opens, closes in self.occurrences(after):
            if closes > after:
                return opens, closes
        return None

"""Operator console for monitoring: health events, idle reservations, share violations, metric series.

Everything here is written by the collectors and jobs; rows are read-only and change only through
actions that call services (resolve, release, dismiss, evict).
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from core.admin_paging import FleetScaleAdminMixin
from core.admin_permissions import OperatorActionsMixin, ReadOnlyAdminMixin

from . import readers
from .buckets import BUCKET, floor
from .choices import HealthLevel, IdleState
from .models import (
    Collector,
    HealthEvent,
    IdleReservation,
    MaintenanceRun,
    RollupRun,
    Series,
    ShareViolation,
    TrespassEvent,
)
from .readers.sparkline import sparkline
from .services import health as health_services
from .services import idle as idle_services
from .tasks import evict_over_share_task, evict_trespass_task

LEVEL_COLOURS = {HealthLevel.NORMAL: "#2e7d32", HealthLevel.WARNING: "#ef6c00", HealthLevel.CRITICAL: "#c62828"}


class ReadOnlyAdmin(ReadOnlyAdminMixin, OperatorActionsMixin, admin.ModelAdmin):
    """Health events and metrics: recorded by the collectors, acted on through actions, never edited."""


def _unit(gpu, mig_instance) -> str:
    if mig_instance is not None:
        return f"{mig_instance.profile.name} GI {mig_instance.gi_id} on {gpu.node.name}/GPU {gpu.index}"
    return f"{gpu.node.name}/GPU {gpu.index}"


# --- Health events -------------------------------------------------------------------------------


class OpenFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return [("open", "Open"), ("resolved", "Resolved")]

    def queryset(self, request, queryset):
        if self.value() == "open":
            return queryset.filter(resolved_at__isnull=True)
        if self.value() == "resolved":
            return queryset.filter(resolved_at__isnull=False)
        return queryset


@admin.register(HealthEvent)
class HealthEventAdmin(FleetScaleAdminMixin, ReadOnlyAdmin):
    list_display = [
        "opened_at",
        "level_badge",
        "rule",
        "unit",
        "cluster",
        "value",
        "occurrences",
        "last_seen_at",
        "resolved_at",
        "message",
    ]
    list_filter = ["level", "rule", OpenFilter, ("gpu__node__cluster", admin.RelatedOnlyFieldListFilter), "source"]
    list_select_related = ["gpu__node__cluster", "mig_instance__profile"]
    search_fields = ["gpu__uuid", "mig_instance__uuid", "gpu__node__name", "message"]
    date_hierarchy = "opened_at"
    actions = ["resolve_selected"]

    @admin.display(description="level", ordering="level")
    def level_badge(self, obj):
        return format_html(
            '<strong style="color:{}">{}</strong>', LEVEL_COLOURS.get(obj.level, "#333"), obj.get_level_display()
        )

    @admin.display(description="GPU / instance")
    def unit(self, obj):
        return _unit(obj.gpu, obj.mig_instance)

    @admin.display(description="cluster", ordering="gpu__node__cluster__name")
    def cluster(self, obj):
        return obj.gpu.node.cluster.name

    @admin.action(
        description="Resolve selected events (a condition still present reopens at the next reading)",
        permissions=["operate"],
    )
    def resolve_selected(self, request, queryset):
        done = health_services.resolve_events(list(queryset.values_list("pk", flat=True)), actor=request.user)
        self.message_user(request, f"{done} event(s) resolved.", messages.SUCCESS)


# --- Idle reservations ---------------------------------------------------------------------------


@admin.register(IdleReservation)
class IdleReservationAdmin(FleetScaleAdminMixin, ReadOnlyAdmin):
    list_display = [
        "detected_at",
        "project",
        "pool",
        "unit",
        "sm_active_avg",
        "mem_used_max_mib",
        "coverage",
        "proposal",
        "suggested_profile",
        "state",
    ]
    list_filter = ["state", "proposal"]
    list_select_related = ["allocation__project", "allocation__pool", "allocation__gpu__node"]
    search_fields = ["allocation__project__slug", "allocation__pool__name", "allocation__gpu__uuid"]
    actions = ["release_selected", "dismiss_selected"]

    @admin.display(description="project", ordering="allocation__project__slug")
    def project(self, obj):
        return obj.allocation.project.slug

    @admin.display(description="pool")
    def pool(self, obj):
        return obj.allocation.pool.name

    @admin.display(description="unit")
    def unit(self, obj):
        a = obj.allocation
        return f"{a.product} {a.profile_name or a.kind} on {a.gpu.node.name}/GPU {a.gpu.index}"

    @admin.action(description="Release the selected allocations (one step)", permissions=["operate"])
    def release_selected(self, request, queryset):
        done = 0
        for pk in queryset.filter(state=IdleState.OPEN).order_by("pk").values_list("pk", flat=True):
            try:
                done += idle_services.release_idle(pk, actor=request.user)
            except Exception as exc:  # a refused release (e.g. the request moved on) is reported, not raised
                self.message_user(request, f"Flag {pk}: {exc}", messages.ERROR)
        self.message_user(request, f"{done} allocation(s) released.", messages.SUCCESS)

    @admin.action(description="Dismiss the selected flags (keep the reservation)", permissions=["operate"])
    def dismiss_selected(self, request, queryset):
        done = idle_services.dismiss(list(queryset.values_list("pk", flat=True)), actor=request.user)
        self.message_user(request, f"{done} flag(s) dismissed.", messages.SUCCESS)


# --- Time-slice share violations -----------------------------------------------------------------


@admin.register(ShareViolation)
class ShareViolationAdmin(FleetScaleAdminMixin, ReadOnlyAdmin):
    list_display = [
        "first_seen_at",
        "namespace",
        "pod_name",
        "gpu",
        "over",
        "used_mib",
        "share_mib",
        "sm_util_pct",
        "replicas",
        "share_priority",
        "state",
        "last_seen_at",
        "resolved_at",
    ]
    list_filter = ["state", "over", "share_priority", ("resolved_at", admin.EmptyFieldListFilter)]
    list_select_related = ["gpu__node"]
    search_fields = ["namespace", "pod_name", "pod_uid", "gpu__uuid"]
    actions = ["evict_selected"]

    @admin.action(description="Evict the selected pods now (Eviction API)", permissions=["operate"])
    def evict_selected(self, request, queryset):
        ids = list(queryset.filter(resolved_at__isnull=True).order_by("pk").values_list("pk", flat=True))
        for pk in ids:
            evict_over_share_task.delay_on_commit(pk)
        self.message_user(request, f"{len(ids)} eviction(s) queued.", messages.SUCCESS)


class TrespassOpenFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return [("open", "Open"), ("closed", "Closed")]

    def queryset(self, request, queryset):
        if self.value() == "open":
            return queryset.filter(ended_at__isnull=True)
        if self.value() == "closed":
            return queryset.filter(ended_at__isnull=False)
        return queryset


@admin.register(TrespassEvent)
class TrespassEventAdmin(FleetScaleAdminMixin, ReadOnlyAdmin):
    list_display = [
        "started_at",
        "kind",
        "unit",
        "owner_project",
        "project",
        "pod",
        "state",
        "ended_at",
        "evicted_at",
    ]
    list_filter = [TrespassOpenFilter, "kind", "gpu__node__cluster"]
    list_select_related = ["gpu__node", "mig_instance__profile", "owner_project", "project"]
    search_fields = ["namespace", "pod_name", "pod_uid", "gpu__uuid", "mig_instance__uuid"]
    actions = ["evict_selected"]

    @admin.display(description="Unit")
    def unit(self, obj):
        return _unit(obj.gpu, obj.mig_instance)

    @admin.display(description="Pod")
    def pod(self, obj):
        return f"{obj.namespace}/{obj.pod_name}" if obj.pod_name else "-"

    @admin.action(description="Evict the selected trespassing pods now (Eviction API)", permissions=["operate"])
    def evict_selected(self, request, queryset):
        ids = list(
            queryset.filter(ended_at__isnull=True).exclude(pod_name="").order_by("pk").values_list("pk", flat=True)
        )
        for pk in ids:
            evict_trespass_task.delay_on_commit(pk)
        self.message_user(request, f"{len(ids)} eviction(s) queued.", messages.SUCCESS)


# --- Metric series: latest values and a 24 h chart -----------------------------------------------


class KindFilter(admin.SimpleListFilter):
    title = "kind"
    parameter_name = "kind"

    def lookups(self, request, model_admin):
        return [("gpu", "GPU"), ("mig", "MIG instance")]

    def queryset(self, request, queryset):
        if self.value() == "gpu":
            return queryset.filter(mig_instance__isnull=True)
        if self.value() == "mig":
            return queryset.filter(mig_instance__isnull=False)
        return queryset


class LatestChangeList(ChangeList):
    """Loads the newest sample of every series on the page in one query (not one per row)."""

    def get_results(self, request):
        super().get_results(request)
        ids = [s.pk for s in self.result_list]
        latest = readers.latest_samples(ids, since=timezone.now() - timedelta(hours=1))
        for series in self.result_list:
            series.latest = latest.get(series.pk)


def _fmt(value, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}{unit}" if isinstance(value, float) else f"{value}{unit}"


@admin.register(Series)
class SeriesAdmin(FleetScaleAdminMixin, ReadOnlyAdmin):
    list_display = ["id", "unit", "cluster", "kind", "source", "sm_active", "power", "memory", "temperature", "seen"]
    list_filter = [KindFilter, "source", ("gpu__node__cluster", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["gpu__node__cluster", "mig_instance__profile"]
    search_fields = ["gpu__uuid", "mig_instance__uuid", "gpu__node__name"]
    fields = ["unit", "kind", "source", "mem_total_mib", "latest_values", "chart_24h", "open_events"]
    readonly_fields = fields

    def get_changelist(self, request, **kwargs):
        return LatestChangeList

    @admin.display(description="GPU / instance")
    def unit(self, obj):
        return _unit(obj.gpu, obj.mig_instance)

    @admin.display(description="cluster")
    def cluster(self, obj):
        return obj.gpu.node.cluster.name

    @admin.display(description="kind")
    def kind(self, obj):
        return "MIG instance" if obj.mig_instance_id else "GPU"

    def _latest(self, obj):
        return getattr(obj, "latest", None)

    @admin.display(description="SM active")
    def sm_active(self, obj):
        latest = self._latest(obj)
        return _fmt(latest.sm_active if latest else None, " %")

    @admin.display(description="power")
    def power(self, obj):
        latest = self._latest(obj)
        return _fmt(latest.power_w if latest else None, " W")

    @admin.display(description="memory used")
    def memory(self, obj):
        latest = self._latest(obj)
        used = latest.mem_used_mib if latest else None
        return f"{_fmt(used, ' MiB')} / {_fmt(obj.mem_total_mib, ' MiB')}"

    @admin.display(description="temp.")
    def temperature(self, obj):
        latest = self._latest(obj)
        return _fmt(latest.temp_c if latest else None, " °C")

    @admin.display(description="latest sample")
    def seen(self, obj):
        latest = self._latest(obj)
        return latest.ts if latest else "–"

    @admin.display(description="latest values")
    def latest_values(self, obj):
        latest = readers.latest_samples([obj.pk], since=timezone.now() - timedelta(days=1)).get(obj.pk)
        if latest is None:
            return "no sample in the last 24 h"
        rows = [
            ("time", latest.ts),
            ("SM activity", _fmt(latest.sm_active, " %")),
            ("GPU utilisation", _fmt(latest.gpu_util, " %")),
            ("power", _fmt(latest.power_w, " W")),
            ("energy counter", _fmt(latest.energy_mj, " mJ")),
            ("memory used", _fmt(latest.mem_used_mib, " MiB")),
            ("temperature", _fmt(latest.temp_c, " °C")),
            ("ECC single-bit (volatile / aggregate)", f"{_fmt(latest.ecc_sbe_vol)} / {_fmt(latest.ecc_sbe_agg)}"),
            ("ECC double-bit (volatile / aggregate)", f"{_fmt(latest.ecc_dbe_vol)} / {_fmt(latest.ecc_dbe_agg)}"),
            ("remapped rows (corr. / uncorr.)", f"{_fmt(latest.remap_corr)} / {_fmt(latest.remap_unc)}"),
            ("remap pending / failed", f"{_fmt(latest.remap_pending)} / {_fmt(latest.remap_failure)}"),
            ("retired pages", _fmt(latest.retired_pages)),
            ("last XID", _fmt(latest.xid)),
            ("throttle reasons", "–" if latest.throttle is None else f"0x{latest.throttle:x}"),
        ]
        body = format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows)
        return format_html("<table>{}</table><p class='help'>– = not available on this GPU/source</p>", body)

    @admin.display(description="last 24 h (5-minute steps)")
    def chart_24h(self, obj):
        end = timezone.now()
        points = readers.series_points([obj.pk], end - timedelta(hours=24), end, step="5m")[obj.pk]
        slots = _by_bucket(points, end)
        charts = [
            ("SM activity %", "sm_active", 100.0, "#417690"),
            ("power W", "power_w", None, "#c62828"),
            ("memory MiB", "mem_used_mib", float(obj.mem_total_mib) if obj.mem_total_mib else None, "#6a1b9a"),
        ]
        rows = [
            (label, sparkline([p.get(key) if p else None for p in slots], top=top, colour=colour, title=label))
            for label, key, top, colour in charts
        ]
        return format_html_join("", "<div><small>{}</small><br>{}</div>", rows)

    @admin.display(description="open health events")
    def open_events(self, obj):
        events = HealthEvent.objects.open().filter(gpu_id=obj.gpu_id)
        if obj.mig_instance_id:
            events = events.filter(mig_instance__isnull=True) | events.filter(mig_instance_id=obj.mig_instance_id)
        rows = [(e.get_level_display(), e.get_rule_display(), e.opened_at) for e in events.order_by("-opened_at")]
        if not rows:
            return "none"
        return format_html_join("", "<div>{}: {} since {}</div>", rows)


def _by_bucket(points: list[dict], end) -> list[dict | None]:
    """288 five-minute slots ending at `end`; a slot without a point is a gap."""
    last = floor(end, BUCKET["5m"])
    first = last - timedelta(minutes=5 * 287)
    by_ts = {p["ts"]: p for p in points}
    return [by_ts.get(first + timedelta(minutes=5 * i)) for i in range(288)]


# --- Jobs and sources ----------------------------------------------------------------------------


@admin.register(Collector)
class CollectorAdmin(ReadOnlyAdmin):
    list_display = [
        "target",
        "cluster",
        "source",
        "last_success_at",
        "last_attempt_at",
        "last_samples",
        "late_dropped_samples",
        "ok",
    ]
    list_filter = ["source", "cluster"]
    list_select_related = ["cluster"]
    search_fields = ["target", "last_error"]

    @admin.display(boolean=True, description="OK")
    def ok(self, obj):
        return not obj.last_error


@admin.register(MaintenanceRun)
class MaintenanceRunAdmin(ReadOnlyAdmin):
    list_display = ["job", "status", "started_at", "finished_at", "result", "error"]
    list_filter = ["job", "status"]
    search_fields = ["job", "error"]


@admin.register(RollupRun)
class RollupRunAdmin(ReadOnlyAdmin):
    list_display = ["level", "complete_until", "last_finished_at", "last_duration_s", "last_rows", "last_error"]

"""Allocations as billing sees them: when each one's clock ran, and which of that time is credited.

- The clock starts at Allocation.allocated_at and stops at the earlier of its release and the
  request's end_at (expiry).
- Provisioning failed: a request that failed and never became active is credited its whole life;
  once it has been active, only each failed period is credited (failed_windows).
- Units on a GPU with an open critical health event are credited for that time, never twice when
  also failed (health_windows, hour_figures).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction

from capacity.mig.share import shares_per_gpu, unit_share
from pools.choices import PoolState, RequestState
from pools.models import PoolRequestTransition
from pricing import rates
from pricing.rates import EPOCH

from .. import measurements
from ..choices import ALLOCATION_COLUMNS
from ..periods import HOUR, floor_hour
from .intervals import Interval, intersect, seconds_in, subtract

ALLOCATION_FIELDS = (
    *ALLOCATION_COLUMNS,
    "gpu_id",
    "mig_instance_id",
    "allocated_at",
    "released_at",
    "pool__request_id",
    "pool__request__end_at",
    "pool__request__state",
    "pool__state",
    "gpu__node__timeslice_replicas",
)


@dataclass
class Unit:
    """An allocation as metering sees it."""

    id: int
    project_id: int
    pool_id: int
    kind: str
    product: str
    profile_name: str
    compute_slices: int
    gpu_id: int
    mig_instance_id: int | None
    start: datetime
    stop: datetime | None  # the clock stops here (release or expiry); None = still running
    request_id: int
    failed_now: bool
    replicas: int

    @classmethod
    def from_row(cls, row: dict) -> Unit:
        stops = [t for t in (row["released_at"], row["pool__request__end_at"]) if t is not None]
        return cls(
            id=row["id"],
            project_id=row["project_id"],
            pool_id=row["pool_id"],
            kind=row["kind"],
            product=row["product"],
            profile_name=row["profile_name"],
            compute_slices=row["compute_slices"],
            gpu_id=row["gpu_id"],
            mig_instance_id=row["mig_instance_id"],
            start=row["allocated_at"],
            stop=min(stops) if stops else None,
            request_id=row["pool__request_id"],
            failed_now=row["pool__request__state"] == RequestState.FAILED or row["pool__state"] == PoolState.FAILED,
            replicas=_replicas(row),
        )

    @property
    def spec(self) -> rates.SpecKey:
        return rates.spec_key(self.kind, self.product, self.profile_name, self.replicas)

    def share(self) -> Fraction:
        return unit_share(
            self.kind, self.product, self.profile_name, compute_slices=self.compute_slices, replicas=self.replicas
        )

    def clock(self, start: datetime, end: datetime) -> list[Interval]:
        """Where the clock ran within [start, end)."""
        return intersect([(self.start, self.stop or end)], [(start, end)])

    def hours(self, until: datetime) -> list[datetime]:
        """The UTC hours in which the clock ran, before `until`."""
        last = min(self.stop or until, until)
        hour, out = floor_hour(self.start), []
        while hour < last:
            out.append(hour)
            hour += HOUR
        return out


def _replicas(row: dict) -> int:
    """Shares per GPU: a vGPU type's vGPUs per GPU, else the node's time-slice replicas."""
    return shares_per_gpu(row["kind"], row["profile_name"], row["gpu__node__timeslice_replicas"])


def units_of(queryset) -> list[Unit]:
    return [Unit.from_row(row) for row in queryset.values(*ALLOCATION_FIELDS).order_by("id")]


def failed_windows(units: list[Unit], until: datetime) -> dict[int, list[Interval]]:
    """Per request: the periods its usage is credited because provisioning had failed.

    A request that has failed and never became active was never delivered: its whole life is
    credited (whatever its state now: failed, provisioning again, released, expired). Once it has
    been active (a retry succeeded, or it failed later), only each failed period is credited: from
    a transition into "failed" to the next transition out of it, or to `until` while it lasts.
    A request or pool failed now with no failure in the history is credited from its last transition.
    """
    failed_now = {u.request_id for u in units if u.failed_now}
    request_ids = {u.request_id for u in units}
    ever_failed = set(
        PoolRequestTransition.objects.filter(request_id__in=request_ids, to_state=RequestState.FAILED, at__lt=until)
        .order_by()
        .values_list("request_id", flat=True)
        .distinct()
    )
    involved = failed_now | ever_failed
    if not involved:
        return {}
    history: dict[int, list[dict]] = defaultdict(list)
    for t in (
        PoolRequestTransition.objects.filter(request_id__in=involved, at__lt=until)
        .order_by("request_id", "at", "id")
        .values("request_id", "from_state", "to_state", "at")
    ):
        history[t["request_id"]].append(t)
    windows: dict[int, list[Interval]] = {}
    for rid in sorted(involved):
        transitions = history.get(rid, [])
        if not any(t["to_state"] == RequestState.ACTIVE for t in transitions):
            windows[rid] = [(EPOCH, until)]
            continue
        periods: list[Interval] = []
        opened: datetime | None = None
        for t in transitions:
            if t["to_state"] == RequestState.FAILED and opened is None:
                opened = t["at"]
            elif t["from_state"] == RequestState.FAILED and opened is not None:
                periods.append((opened, t["at"]))
                opened = None
        if opened is None and rid in failed_now:
            opened = transitions[-1]["at"]
        if opened is not None:
            periods.append((opened, until))
        windows[rid] = periods
    return windows


def health_windows(units: list[Unit], start: datetime, end: datetime) -> dict[int, list[Interval]]:
    """Per allocation: the critical health periods that withheld it within [start, end), disjoint.

    A MIG unit is withheld by its GPU's events and its own instance's, which may overlap: they are merged
    (clip_windows), so hour_figures credits each second once.
    """
    raw = measurements.critical_health_windows(None, start, end)
    if not raw:
        return {}
    gpus = {gpu_id for gpu_id, _ in raw}
    return {
        u.id: measurements.clip_windows(measurements.windows_for(raw, u.gpu_id, u.mig_instance_id), start, end)
        for u in units
        if u.gpu_id in gpus
    }


@dataclass
class HourFigures:
    seconds: int
    failed: int
    health: int


def hour_figures(unit: Unit, hour: datetime, failed: list[Interval], health: list[Interval]) -> HourFigures:
    """Reserved, failed-credit and health-credit seconds of `unit` in `hour` (health never double-credits failed).

    `failed` and `health` are each disjoint (as failed_windows and health_windows return them), so the credits
    are parts of the clock's seconds that do not overlap: failed_s + health_s <= seconds.
    """
    ran = unit.clock(hour, hour + HOUR)
    seconds = seconds_in(ran)
    failed_s = seconds_in(intersect(ran, failed)) if failed else 0
    health_s = seconds_in(subtract(intersect(ran, health), failed)) if health else 0
    return HourFigures(seconds, failed_s, health_s)

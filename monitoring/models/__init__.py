"""Monitoring's models, one module per concern; imported from here (`monitoring.models`), as before.

- series.py: Series, the 4-byte id of each GPU, MIG instance and vGPU a sample is keyed by;
- samples.py: Sample, the 5-minute and hourly rollups, their runs, maintenance runs and collectors;
- events.py: health events, idle reservations, share violations, trespass events, idle memory.
"""

from .events import (
    ANOTHER_PROJECT,
    HealthEvent,
    HealthEventQuerySet,
    IdleMemory,
    IdleReservation,
    IdleReservationQuerySet,
    ShareViolation,
    TrespassEvent,
    TrespassEventQuerySet,
    TrespassSides,
)
from .samples import (
    SAMPLE_COLUMNS,
    SAMPLE_PG_TYPES,
    Collector,
    MaintenanceRun,
    RealField,
    Rollup,
    Rollup1h,
    Rollup5m,
    RollupRun,
    Sample,
)
from .series import Series, SeriesQuerySet

__all__ = [
    "ANOTHER_PROJECT",
    "SAMPLE_COLUMNS",
    "SAMPLE_PG_TYPES",
    "Collector",
    "HealthEvent",
    "HealthEventQuerySet",
    "IdleMemory",
    "IdleReservation",
    "IdleReservationQuerySet",
    "MaintenanceRun",
    "RealField",
    "Rollup",
    "Rollup1h",
    "Rollup5m",
    "RollupRun",
    "Sample",
    "Series",
    "SeriesQuerySet",
    "ShareViolation",
    "TrespassEvent",
    "TrespassEventQuerySet",
    "TrespassSides",
]

"""monitoring: what the GPUs are doing, and what gpuaas does about it.

Owns the metrics store: Series, Sample, rollups and their runs, maintenance runs and collectors (models/), the
NVML node polls and DCGM scrapes (services.collect, ingest/: the node-side ingest worker and DCGM parsing),
rollups and retention, and reading it all back (readers/: series, aggregates, cards, sparklines). Also the
events it detects: HealthEvent, IdleReservation, ShareViolation, TrespassEvent, IdleMemory (services: health,
idle, timeslice, trespass, lending of idle units), the Prometheus exposition, and the poll, rollup, prune,
idle, cordon, eviction, trespass and lending tasks.

Layer: above scheduling, pools, pricing, capacity, core and tenancy, which it may import (lending idle units
follows the queue's order); below operations, billing, notifications and gpuaas. It hears from capacity
through capacity.signals.workloads_attributed (a trespass check, connected in MonitoringConfig.ready()) and
tells the layers above through monitoring.signals (idle_reservation_flagged, trespass_opened), sent inside
the detecting transaction.
"""

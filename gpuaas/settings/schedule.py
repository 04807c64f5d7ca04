"""The static beat schedule (`expires` equal to each period) and the active/standby beat (celery-redbeat)."""

from __future__ import annotations

from datetime import timedelta

from celery.schedules import crontab

from .base import _broker_url
from .env import (
    ConfigurationError,
    env_str,
)
from .workers import (
    ALLOCATION_ENDING_SWEEP_S,
    BILLING_METER_INTERVAL_S,
    DISCOVERY_INTERVAL_S,
    LENDING_INTERVAL_S,
    LENDING_RECONCILE_INTERVAL_S,
    METRICS_INTERVAL_S,
    MIG_RECONFIG_SWEEP_S,
    MONITORING_IDLE_INTERVAL_S,
    MONITORING_RETENTION_INTERVAL_S,
    MONITORING_ROLLUP_INTERVAL_S,
    NOTIFY_EXPIRY_INTERVAL_S,
    NOTIFY_SWEEP_S,
    POOL_EXPIRY_INTERVAL_S,
    POOL_RECONCILE_INTERVAL_S,
    QUEUE_FORECAST_INTERVAL_S,
    QUEUE_PROCESS_INTERVAL_S,
    WORKFLOW_SWEEP_S,
)

# --- Periodic jobs ----------------------------------------------------------------------------


def every(seconds: int, task: str) -> dict:
    """A beat entry that runs `task` every `seconds` and expires after one period (no backlog piles up)."""
    return {"task": task, "schedule": timedelta(seconds=seconds), "options": {"expires": seconds}}


# Static beat schedule; `expires` equals the period so a backlog never piles up.
CELERY_BEAT_SCHEDULE = {
    "discover-all-clusters": every(DISCOVERY_INTERVAL_S, "capacity.tasks.discover_all_task"),
    "capacity-reconcile-tier-labels": every(DISCOVERY_INTERVAL_S, "capacity.tasks.reconcile_all_tier_labels_task"),
    "capacity-sweep-reconfigurations": every(MIG_RECONFIG_SWEEP_S, "capacity.tasks.sweep_reconfigurations_task"),
    "operations-sweep-drains": every(MIG_RECONFIG_SWEEP_S, "operations.tasks.sweep_drains_task"),
    "operations-sweep-driver-upgrades": every(MIG_RECONFIG_SWEEP_S, "operations.tasks.sweep_driver_upgrades_task"),
    "pools-expire-requests": every(POOL_EXPIRY_INTERVAL_S, "pools.tasks.expire_requests_task"),
    "pools-sweep-provisioning": every(WORKFLOW_SWEEP_S, "pools.tasks.sweep_provisioning_task"),
    "pools-reconcile": every(POOL_RECONCILE_INTERVAL_S, "pools.tasks.reconcile_pools_task"),
    "pools-process-queue": every(QUEUE_PROCESS_INTERVAL_S, "pools.tasks.process_queue_task"),
    "pools-refresh-forecasts": every(QUEUE_FORECAST_INTERVAL_S, "pools.tasks.refresh_forecasts_task"),
    "pools-reconcile-loans": every(LENDING_RECONCILE_INTERVAL_S, "pools.tasks.reconcile_loans_task"),
    "pools-sweep-ending": every(ALLOCATION_ENDING_SWEEP_S, "pools.tasks.sweep_ending_task"),
    "monitoring-lend-idle": every(LENDING_INTERVAL_S, "monitoring.tasks.lend_idle_task"),
    "monitoring-poll-metrics": every(METRICS_INTERVAL_S, "monitoring.tasks.poll_metrics_task"),
    "monitoring-rollup": every(MONITORING_ROLLUP_INTERVAL_S, "monitoring.tasks.rollup_metrics_task"),
    "monitoring-retention": every(MONITORING_RETENTION_INTERVAL_S, "monitoring.tasks.prune_metrics_task"),
    "monitoring-idle-reservations": every(MONITORING_IDLE_INTERVAL_S, "monitoring.tasks.detect_idle_reservations_task"),
    # Billing: meter every complete hour (a no-op until one ends); close last month on the 1st.
    "billing-meter-usage": every(BILLING_METER_INTERVAL_S, "billing.tasks.meter_usage_task"),
    "billing-sweep": every(WORKFLOW_SWEEP_S, "billing.tasks.sweep_billing_task"),
    "notifications-pools-expiring": every(NOTIFY_EXPIRY_INTERVAL_S, "notifications.tasks.announce_expiring_task"),
    "notifications-digest": every(3600, "notifications.tasks.operator_digest_task"),
    "notifications-sweep": every(NOTIFY_SWEEP_S, "notifications.tasks.sweep_deliveries_task"),
    "billing-close-month": {
        "task": "billing.tasks.close_month_task",
        "schedule": crontab(minute=30, hour=0, day_of_month=1),
        "options": {"expires": 28 * 24 * 3600},
    },
}


# --- Beat: an active one and a standby (docs/reliability.md "Beat") ---------------------------
# With Redis (REDBEAT_REDIS_URL, else a Redis CELERY_BROKER_URL), celery-redbeat keeps each entry's last
# run in Redis and only the beat holding its lock sends; a second beat blocks on the lock, trying every
# loop interval, and takes over once the active one stops renewing it (SIGKILL, a lost node). Without
# Redis (the embedded default, `manage.py demo`): Celery's file scheduler and exactly one beat.
def beat_takeover(schedule: dict) -> tuple[int, int]:
    """(loop interval, lock timeout) in seconds, so that a standby sends within one shortest period.

    The active beat renews the lock to `lock` at every loop, at most `loop` apart; when it dies the lock
    has at most `lock` seconds left, and the standby tries every `loop`: it holds the lock within
    lock + loop = 5 * (shortest // 6) <= 5/6 of the shortest period (at least 5 s: loop is 1 s or more).
    The active one keeps 3 loops of margin before its lock would lapse under it.
    """
    periods = [int(e["schedule"].total_seconds()) for e in schedule.values() if isinstance(e["schedule"], timedelta)]
    loop = max(1, min(periods, default=60) // 6)
    return loop, 4 * loop


REDBEAT_REDIS_URL = env_str(
    "REDBEAT_REDIS_URL", _broker_url if _broker_url.startswith(("redis://", "rediss://")) else ""
)
if REDBEAT_REDIS_URL:
    if not REDBEAT_REDIS_URL.startswith(("redis://", "rediss://")):
        raise ConfigurationError(f"REDBEAT_REDIS_URL must be a redis:// or rediss:// URL, got {REDBEAT_REDIS_URL!r}")
    CELERY_BEAT_SCHEDULER = "redbeat.RedBeatScheduler"
    CELERY_BEAT_MAX_LOOP_INTERVAL, REDBEAT_LOCK_TIMEOUT = beat_takeover(CELERY_BEAT_SCHEDULE)
    # redbeat reads its REDBEAT_* names without the CELERY_ namespace (it checks the raw key names).
    # Options explicit, or redbeat falls back to the broker's transport options (deprecated in 2.4.2).
    REDBEAT_REDIS_OPTIONS: dict = {}

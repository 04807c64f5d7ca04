"""Celery and the apps' background work: broker, queues, and each app's intervals, limits and thresholds."""

from __future__ import annotations

from .base import DEBUG, VAR_DIR
from .env import (
    ConfigurationError,
    env_bool,
    env_int,
    env_list,
    env_str,
)

# --- Celery ---------------------------------------------------------------------------------
# Embedded default: kombu's SQLAlchemy transport on a SQLite file. Its consumers claim a message inside
# BEGIN IMMEDIATE, so concurrent workers never see half-written or doubly delivered messages (the
# filesystem transport did: kombu's open bug of a reader decoding a partially written file).
EMBEDDED_BROKER_PATH = VAR_DIR / "celery-broker.sqlite3"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", f"sqla+sqlite:///{EMBEDDED_BROKER_PATH}")
_BROKER_SCHEMES = {"sqla+sqlite", "redis", "rediss", "memory"}
if CELERY_BROKER_URL.split("://")[0] not in _BROKER_SCHEMES:
    raise ConfigurationError(
        f"CELERY_BROKER_URL must be redis://, rediss:// or sqla+sqlite:///PATH (embedded), got {CELERY_BROKER_URL!r}"
    )
CELERY_LONGEST_TASK_S = 30 * 60
if CELERY_BROKER_URL.startswith("sqla+sqlite://"):
    # create_engine() options: wait up to 30 s for another process's write lock instead of failing
    # with "database is locked" after SQLite's default 5 s.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"connect_args": {"timeout": 30}}
elif CELERY_BROKER_URL.startswith("memory://"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
else:
    # Redis redelivers unacknowledged messages after visibility_timeout: keep it above the longest task.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_LONGEST_TASK_S * 2}
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = CELERY_LONGEST_TASK_S
CELERY_TASK_SOFT_TIME_LIMIT = CELERY_LONGEST_TASK_S - 60
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ROUTES = {
    "capacity.tasks.discover_cluster_task": {"queue": "discovery"},
    "capacity.tasks.discover_all_task": {"queue": "discovery"},
    "monitoring.tasks.*": {"queue": "metrics"},
    "billing.tasks.*": {"queue": "billing"},
}
# The node agent's tasks live outside the apps' tasks modules.
CELERY_IMPORTS = ["capacity.agent.tasks"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# --- Recovery of long operations (core/leases.py; docs/reliability.md) -----------------------
# A claimed workflow step holds a lease that its worker renews every third of it; once a lease runs
# out (worker SIGKILLed, message lost), the next sweep re-enqueues the work. Recovery takes at most
# WORKFLOW_LEASE_S + WORKFLOW_SWEEP_S: keep the sum under a minute.
WORKFLOW_LEASE_S = env_int("WORKFLOW_LEASE_S", 20, minimum=2)
WORKFLOW_SWEEP_S = env_int("WORKFLOW_SWEEP_S", 30, minimum=1)
# Level-triggered reconcile of every provisioned pool's Kubernetes objects (quota, labels, namespace).
POOL_RECONCILE_INTERVAL_S = env_int("POOL_RECONCILE_INTERVAL_S", 60, minimum=1)

# --- Capacity: discovery, MIG reconfiguration, time-slicing (docs/discovery.md, docs/mig.md) -----
DISCOVERY_INTERVAL_S = env_int("DISCOVERY_INTERVAL_S", 60, minimum=5)
# The tier plan's maintenance reserve: per cluster and tier, the units of this many GPUs (those carrying the
# most) are held back so one can be drained for a driver, firmware or MIG change without refusing work
# (docs/tiers.md, "Capacity plan per tier"). 0 plans without a reserve.
CAPACITY_MAINTENANCE_RESERVE_GPUS = env_int("CAPACITY_MAINTENANCE_RESERVE_GPUS", 1, minimum=0)
GPU_OPERATOR_NAMESPACE = env_str("GPU_OPERATOR_NAMESPACE", "gpu-operator")
# gpuaas's own mig-parted ConfigMap; point the ClusterPolicy's spec.migManager.config.name at it.
MIG_PARTED_CONFIGMAP = env_str("MIG_PARTED_CONFIGMAP", "gpuaas-mig-parted-config")
# The device plugin's config ConfigMap (ClusterPolicy spec.devicePlugin.config.name).
TIME_SLICING_CONFIGMAP = env_str("TIME_SLICING_CONFIGMAP", "time-slicing-config")
# Kubelet refreshes the MIG manager's mounted copy of that ConfigMap up to about a minute after a
# write (sync period + cache TTL): gpuaas sets nvidia.com/mig.config this long after writing a config.
MIG_PARTED_SYNC_S = env_int("MIG_PARTED_SYNC_S", 90, minimum=0)
# Waiting steps re-check with this countdown: far below the Redis visibility timeout.
MIG_RECONFIG_POLL_S = env_int("MIG_RECONFIG_POLL_S", 5, minimum=1)
if MIG_RECONFIG_POLL_S * 10 > CELERY_LONGEST_TASK_S:
    raise ConfigurationError("MIG_RECONFIG_POLL_S must stay far below the broker visibility timeout")
MIG_DRAIN_TIMEOUT_S = env_int("MIG_DRAIN_TIMEOUT_S", 900, minimum=10)
MIG_APPLY_TIMEOUT_S = env_int("MIG_APPLY_TIMEOUT_S", 1200, minimum=10)
# Agent backend: the MIG command goes out again when no signed result came back this long after it.
MIG_AGENT_RESEND_S = env_int("MIG_AGENT_RESEND_S", 120, minimum=1)
MIG_VERIFY_TIMEOUT_S = env_int("MIG_VERIFY_TIMEOUT_S", 300, minimum=10)
MIG_RECONFIG_SWEEP_S = env_int("MIG_RECONFIG_SWEEP_S", WORKFLOW_SWEEP_S, minimum=1)
# Drain-and-move (docs/maintenance.md): notice before the moved pods are evicted, and how long after that
# notice's deadline PodDisruptionBudgets may hold pods on the node before the drain fails.
MAINTENANCE_GRACE_S = env_int("MAINTENANCE_GRACE_S", 3600, minimum=0)
MAINTENANCE_EVICT_TIMEOUT_S = env_int("MAINTENANCE_EVICT_TIMEOUT_S", 900, minimum=10)
# Rolling driver upgrades (docs/maintenance.md): the largest wave when the cluster has no ClusterPolicy, how
# long a handed-over node may take to come back (upgrade-done, or given back, and healthy) before it is
# marked failed, and how often a rollout's tick looks again.
DRIVER_UPGRADE_MAX_PARALLEL = env_int("DRIVER_UPGRADE_MAX_PARALLEL", 1, minimum=1)
DRIVER_UPGRADE_TIMEOUT_S = env_int("DRIVER_UPGRADE_TIMEOUT_S", 2 * 3600, minimum=60)
DRIVER_UPGRADE_POLL_S = env_int("DRIVER_UPGRADE_POLL_S", 30, minimum=1)

# --- Pools: limits and expiry of pool requests (docs/pools.md) ------------------------------------
POOL_EXPIRY_NOTICE_S = env_int("POOL_EXPIRY_NOTICE_S", 3600, minimum=0)
POOL_EXPIRY_INTERVAL_S = env_int("POOL_EXPIRY_INTERVAL_S", 60, minimum=5)
# The most units one pool request may ask for (the API answers 400 above it).
POOL_REQUEST_MAX_UNITS = env_int("POOL_REQUEST_MAX_UNITS", 512, minimum=1)

# --- Queue: fair share, processing, forecast (docs/queue.md) --------------------------------------
# Fair share counts each project's GPU-hours reserved over this many past hours, over its weight.
QUEUE_FAIR_SHARE_WINDOW_H = env_int("QUEUE_FAIR_SHARE_WINDOW_H", 168, minimum=1)
# Fair share orders a request only for its first hours of waiting: after this many it is served by age
# within its priority class, and no later request of its class overtakes it (0: fair share always orders).
QUEUE_AGED_AFTER_H = env_int("QUEUE_AGED_AFTER_H", 1, minimum=0)
# A pass over the queue after every release, and on this beat too (a node back, a reconfiguration done).
QUEUE_PROCESS_INTERVAL_S = env_int("QUEUE_PROCESS_INTERVAL_S", 60, minimum=5)
QUEUE_FORECAST_INTERVAL_S = env_int("QUEUE_FORECAST_INTERVAL_S", 300, minimum=10)
QUEUE_FORECAST_DRAWS = env_int("QUEUE_FORECAST_DRAWS", 200, minimum=1)
QUEUE_FORECAST_SEED = env_int("QUEUE_FORECAST_SEED", 17, minimum=0)
QUEUE_FORECAST_MIN_SAMPLES = env_int("QUEUE_FORECAST_MIN_SAMPLES", 5, minimum=1)
# Later arrivals (taking units at submission, or ranking ahead) are expected at the rate seen over this
# window (0: not foreseen).
QUEUE_FORECAST_ARRIVALS_WINDOW_H = env_int("QUEUE_FORECAST_ARRIVALS_WINDOW_H", 168, minimum=0)
# With no history: open-ended pools are expected to hold this long; an overdue one to end within OVERDUE.
QUEUE_FORECAST_DEFAULT_HOLD_H = env_int("QUEUE_FORECAST_DEFAULT_HOLD_H", 24, minimum=1)
QUEUE_FORECAST_OVERDUE_H = env_int("QUEUE_FORECAST_OVERDUE_H", 1, minimum=0)
# A MIG reconfiguration that would make room is expected to be done within this long.
QUEUE_FORECAST_RECONFIGURATION_S = env_int("QUEUE_FORECAST_RECONFIGURATION_S", 900, minimum=0)
# A draw that has not started its request this long after now says "not within the horizon" (None).
QUEUE_FORECAST_HORIZON_H = env_int("QUEUE_FORECAST_HORIZON_H", 720, minimum=1)

# --- Monitoring: collection, storage, health, idle reservations (docs/monitoring.md) ------------
METRICS_INTERVAL_S = env_int("METRICS_INTERVAL_S", 30, minimum=5)
# Seconds into a poll period when the nodes without a report for it are asked once more (an agent that
# died mid-read loses its messages until Redis's visibility timeout, an hour, long after they expired).
METRICS_REPOLL_AFTER_S = env_int("METRICS_REPOLL_AFTER_S", METRICS_INTERVAL_S * 2 // 3, minimum=1)
# A node agent with no report accepted for three of its periods (metrics polls, or discovery's inventory reads
# where a DCGM exporter gives the metrics) shows as stale on the cluster page (NodeCapacity.agent_health).
AGENT_STALE_AFTER_S = 3 * max(METRICS_INTERVAL_S, DISCOVERY_INTERVAL_S)
if METRICS_REPOLL_AFTER_S >= METRICS_INTERVAL_S:
    raise ConfigurationError(
        "METRICS_REPOLL_AFTER_S must be below METRICS_INTERVAL_S (the re-poll is within the period)"
    )


def _int_set(name: str, default: str) -> frozenset[int]:
    """Parse "48,63,79" into {48, 63, 79}; anything that is not a list of integers stops start-up."""
    values = env_list(name, default.split(","))
    if not all(v.isdigit() for v in values):
        raise ConfigurationError(f"{name}={','.join(values)!r} must be comma-separated integers (XID codes)")
    return frozenset(int(v) for v in values)


MONITORING_GPM_INTERVAL_MS = env_int("MONITORING_GPM_INTERVAL_MS", 150, minimum=101)
MONITORING_DCGM_TIMEOUT_S = env_int("MONITORING_DCGM_TIMEOUT_S", 5, minimum=1)
MONITORING_COPY_MIN_ROWS = env_int("MONITORING_COPY_MIN_ROWS", 200, minimum=1)
# Off: sample transactions commit without waiting for the WAL flush (telemetry; see docs/monitoring.md).
MONITORING_SYNCHRONOUS_COMMIT = env_bool("MONITORING_SYNCHRONOUS_COMMIT", False)
MONITORING_RETENTION_RAW_DAYS = env_int("MONITORING_RETENTION_RAW_DAYS", 7, minimum=1)
MONITORING_RETENTION_5M_DAYS = env_int("MONITORING_RETENTION_5M_DAYS", 90, minimum=1)
MONITORING_RETENTION_1H_DAYS = env_int("MONITORING_RETENTION_1H_DAYS", 0, minimum=0)  # 0 = keep forever
MONITORING_RETENTION_BATCH = env_int("MONITORING_RETENTION_BATCH", 50_000, minimum=100)
MONITORING_RETENTION_INTERVAL_S = env_int("MONITORING_RETENTION_INTERVAL_S", 3600, minimum=60)
MONITORING_ROLLUP_INTERVAL_S = env_int("MONITORING_ROLLUP_INTERVAL_S", 300, minimum=30)
MONITORING_ROLLUP_GRACE_S = env_int("MONITORING_ROLLUP_GRACE_S", 60, minimum=0)
MONITORING_ROLLUP_LATENESS_S = env_int("MONITORING_ROLLUP_LATENESS_S", 600, minimum=0)
MONITORING_XID_CRITICAL = _int_set("MONITORING_XID_CRITICAL", "48,63,64,74,79,92,94,95")
MONITORING_XID_WARNING = _int_set("MONITORING_XID_WARNING", "13,31,43")
MONITORING_XID_CLEAR_S = env_int("MONITORING_XID_CLEAR_S", 3600, minimum=0)
MONITORING_THROTTLE_CLEAR_S = env_int("MONITORING_THROTTLE_CLEAR_S", 120, minimum=0)
MONITORING_CORDON_ON_CRITICAL = env_bool("MONITORING_CORDON_ON_CRITICAL", False)
MONITORING_IDLE_SM_PCT = env_int("MONITORING_IDLE_SM_PCT", 5, minimum=0)
MONITORING_IDLE_WINDOW_H = env_int("MONITORING_IDLE_WINDOW_H", 24, minimum=1)
MONITORING_IDLE_MIN_COVERAGE_PCT = env_int("MONITORING_IDLE_MIN_COVERAGE_PCT", 50, minimum=1)
MONITORING_IDLE_MEM_MIB = env_int("MONITORING_IDLE_MEM_MIB", 1024, minimum=0)
MONITORING_IDLE_INTERVAL_S = env_int("MONITORING_IDLE_INTERVAL_S", 3600, minimum=60)
MONITORING_SHARE_FACTOR_PCT = env_int("MONITORING_SHARE_FACTOR_PCT", 150, minimum=100)
MONITORING_EVICT_OVER_SHARE = env_bool("MONITORING_EVICT_OVER_SHARE", False)
# Trespass (docs/monitoring.md#trespass): activity on an unallocated unit above this SM percent (the seed
# calls >20% abnormal) or memory in use above this many MiB beyond the driver's own (learned per product and
# profile), sustained over this many consecutive polls; evict trespassing pods through the Eviction API.
MONITORING_TRESPASS_SM_PCT = env_int("MONITORING_TRESPASS_SM_PCT", 20, minimum=0)
MONITORING_TRESPASS_MEM_MIB = env_int("MONITORING_TRESPASS_MEM_MIB", 256, minimum=0)
MONITORING_TRESPASS_POLLS = env_int("MONITORING_TRESPASS_POLLS", 3, minimum=1)
MONITORING_EVICT_TRESPASS = env_bool("MONITORING_EVICT_TRESPASS", False)
# Bearer token Prometheus must send to /metrics; empty: operators' sessions only (DEBUG opens nothing).
MONITORING_METRICS_TOKEN = env_str("MONITORING_METRICS_TOKEN", "")

# --- Billing (docs/billing.md) --------------------------------------------------------------------
BILLING_CURRENCY = env_str("BILLING_CURRENCY", "EUR").upper()
if len(BILLING_CURRENCY) != 3 or not BILLING_CURRENCY.isalpha():
    raise ConfigurationError(f"BILLING_CURRENCY={BILLING_CURRENCY!r} is not an ISO 4217 code such as EUR")


def _gpu_prices(name: str, default: str, *, single: bool = False):
    """Parse "H100-80GB=2.50,H200-141GB=3.20" into {"H100-80GB": Decimal("2.50"), ...}; junk stops start-up.

    `single`: one price, "0.05", returned as a Decimal.
    """
    from decimal import Decimal, InvalidOperation

    if single:
        try:
            value = Decimal((env_str(name, default) or default).strip())
        except InvalidOperation:
            value = Decimal(-1)
        if not value.is_finite() or value < 0:
            raise ConfigurationError(f"{name}: give a price per hour >= 0, e.g. 0.05")
        return value
    prices = {}
    for item in env_list(name, default.split(",")):
        product, _, price = item.partition("=")
        try:
            value = Decimal(price.strip())
        except InvalidOperation:
            value = Decimal(-1)
        if not product.strip() or not value.is_finite() or value < 0:
            raise ConfigurationError(f"{name}: {item!r} is not PRODUCT=PRICE (e.g. H100-80GB=2.50)")
        prices[product.strip()] = value
    return prices


# Full-GPU price per hour by catalog product; MIG and time-slice prices derive from it.
BILLING_DEFAULT_GPU_HOURLY = _gpu_prices(
    "BILLING_DEFAULT_GPU_HOURLY", "H100-80GB=2.50,H200-141GB=3.20,A100-80GB=1.60,A100-40GB=1.20,A30-24GB=0.60"
)
# NVIDIA vGPU licence cost per vGPU-hour, added to a vGPU's derived price (full GPU / vGPUs per GPU).
BILLING_VGPU_LICENCE_HOURLY = _gpu_prices("BILLING_VGPU_LICENCE_HOURLY", "0.05", single=True)
BILLING_METER_INTERVAL_S = env_int("BILLING_METER_INTERVAL_S", 600, minimum=60)
# Credits and showback of the last N hours are recomputed after each metering pass.
BILLING_REFRESH_HOURS = env_int("BILLING_REFRESH_HOURS", 48, minimum=1)


# --- Borrowing idle reservations (docs/queue.md, Borrowing) -----------------------------------------
# A unit idle (monitoring's detector) for at least this long may be lent to another project's queued request.
LENDING_IDLE_H = env_int("LENDING_IDLE_H", 24, minimum=1)
# Between the lender's need and the borrower's pods being evicted.
LENDING_RECLAIM_GRACE_S = env_int("LENDING_RECLAIM_GRACE_S", 120, minimum=0)
LENDING_RECONCILE_INTERVAL_S = env_int("LENDING_RECONCILE_INTERVAL_S", 30, minimum=5)
LENDING_INTERVAL_S = env_int("LENDING_INTERVAL_S", 600, minimum=30)

# --- Reservations that end (docs/pools.md, Ending) ------------------------------------------------
# After an allocation ends (release, expiry, reconfiguration, take-offline) its project's pods on the unit get
# this long to stop; then they are evicted through the Eviction API (PodDisruptionBudgets respected) and, if a
# budget still blocks them this many seconds later, deleted (the hard deadline). The unit stays "ending", and is
# handed to no other project, until no pod uses it. The sweep runs every ALLOCATION_ENDING_SWEEP_S.
ALLOCATION_ENDING_GRACE_S = env_int("ALLOCATION_ENDING_GRACE_S", 300, minimum=0)
ALLOCATION_ENDING_FORCE_AFTER_S = env_int("ALLOCATION_ENDING_FORCE_AFTER_S", 300, minimum=0)
ALLOCATION_ENDING_SWEEP_S = env_int("ALLOCATION_ENDING_SWEEP_S", WORKFLOW_SWEEP_S, minimum=1)


# --- Notifications (docs/notifications.md) -----------------------------------------------------
# Email through Django's backends: SMTP (EMAIL_HOST, default localhost:25 in production); with DEBUG=1 and no
# EMAIL_HOST, the console. EMAIL_BACKEND names any other Django backend.
_EMAIL_HOST = env_str("EMAIL_HOST", "")
EMAIL_HOST = _EMAIL_HOST or "localhost"
EMAIL_PORT = env_int("EMAIL_PORT", 587 if _EMAIL_HOST else 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", bool(_EMAIL_HOST))
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT_S", 10, minimum=1)
EMAIL_BACKEND = env_str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.console.EmailBackend"
    if DEBUG and not _EMAIL_HOST
    else "django.core.mail.backends.smtp.EmailBackend",
)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "gpuaas@localhost")
# Links in messages point here (e.g. https://gpuaas.example.com); empty: paths only.
NOTIFY_BASE_URL = env_str("NOTIFY_BASE_URL", "").rstrip("/")
NOTIFY_WEBHOOK_TIMEOUT_S = env_int("NOTIFY_WEBHOOK_TIMEOUT_S", 10, minimum=1)
# Retries of a failed delivery: exponential backoff from NOTIFY_RETRY_BACKOFF_S, capped, then failed.
NOTIFY_MAX_RETRIES = env_int("NOTIFY_MAX_RETRIES", 6, minimum=0)
NOTIFY_RETRY_BACKOFF_S = env_int("NOTIFY_RETRY_BACKOFF_S", 30, minimum=1)
NOTIFY_RETRY_BACKOFF_MAX_S = env_int("NOTIFY_RETRY_BACKOFF_MAX_S", 600, minimum=1)
if NOTIFY_RETRY_BACKOFF_MAX_S >= CELERY_LONGEST_TASK_S * 2:  # a retry's countdown past it is redelivered early
    raise ConfigurationError("NOTIFY_RETRY_BACKOFF_MAX_S must stay far below the broker visibility timeout")
# A pool whose end is this close is announced once ("about to expire"); the sweep runs every interval.
NOTIFY_EXPIRY_WINDOW_H = env_int("NOTIFY_EXPIRY_WINDOW_H", 24, minimum=1)
NOTIFY_EXPIRY_INTERVAL_S = env_int("NOTIFY_EXPIRY_INTERVAL_S", 300, minimum=10)
# The operators' digest: one per period (hours), covering the events since the previous one.
NOTIFY_DIGEST_INTERVAL_H = env_int("NOTIFY_DIGEST_INTERVAL_H", 24, minimum=1)
# Pending deliveries whose message was lost are sent again after this long without an attempt.
NOTIFY_SWEEP_S = env_int("NOTIFY_SWEEP_S", 900, minimum=60)


# --- Domain policy operators change in the admin (policies app, docs/policies.md) ---------------------
# name -> (minimum, what it decides). The value above (the environment's, or the default) holds until an operator
# sets another in the admin (policies.PolicyValue); deleting that row returns to it. Deployment facts (intervals,
# addresses, timeouts, retention) stay environment-only: they size processes and schedules at start-up.
POLICY: dict[str, tuple[int | None, str]] = {
    "POOL_REQUEST_MAX_UNITS": (1, "The most units one pool request may ask for (the API answers 400 above it)."),
    "POOL_EXPIRY_NOTICE_S": (0, "Seconds before a pool's end when its project gets the expiry notice."),
    "ALLOCATION_ENDING_GRACE_S": (0, "Seconds an ended allocation's pods get to stop before they are evicted."),
    "ALLOCATION_ENDING_FORCE_AFTER_S": (0, "Seconds after that eviction when pods a budget still holds are deleted."),
    "QUEUE_FAIR_SHARE_WINDOW_H": (1, "Hours of reserved GPU-hours fair share counts per project."),
    "QUEUE_AGED_AFTER_H": (0, "Hours of waiting after which a request is served by age (0: fair share always)."),
    "LENDING_IDLE_H": (1, "Hours a dedicated unit must be idle before it may be lent to another project."),
    "LENDING_RECLAIM_GRACE_S": (0, "Seconds a borrower's pods get once the lender needs its unit back."),
    "MAINTENANCE_GRACE_S": (0, "Default notice, in seconds, before pods are moved off a node being drained."),
    "CAPACITY_MAINTENANCE_RESERVE_GPUS": (0, "GPUs per cluster and tier the capacity plan keeps for maintenance."),
    "MONITORING_IDLE_SM_PCT": (0, "Average SM activity (%) under which a reservation counts as idle."),
    "MONITORING_IDLE_WINDOW_H": (1, "Hours of samples the idle detector looks at."),
    "MONITORING_IDLE_MIN_COVERAGE_PCT": (1, "Share of that window (%) samples must cover before idleness is judged."),
    "MONITORING_IDLE_MEM_MIB": (0, "Memory (MiB) under which an idle unit is proposed for release."),
    "MONITORING_SHARE_FACTOR_PCT": (100, "How far (%) over its time-slice share a pod's memory may go."),
    "MONITORING_EVICT_OVER_SHARE": (None, "Evict pods far over their time-slice share (off: report only)."),
    "MONITORING_TRESPASS_SM_PCT": (0, "SM activity (%) on an unallocated unit that counts as trespass."),
    "MONITORING_TRESPASS_MEM_MIB": (0, "Memory (MiB) beyond the driver's own on an unallocated unit that counts."),
    "MONITORING_TRESPASS_POLLS": (1, "Consecutive polls of such activity before a trespass event is opened."),
    "MONITORING_EVICT_TRESPASS": (None, "Evict trespassing pods through the Eviction API (off: report only)."),
    "MONITORING_CORDON_ON_CRITICAL": (None, "Cordon a node when one of its GPUs turns critical."),
}
for _name in POLICY:
    if not isinstance(globals().get(_name), int):  # bool is an int: both kinds of policy are
        raise ConfigurationError(f"POLICY names {_name}, which is not an integer or boolean setting")
# How long each process keeps the policy it read; a change made in the admin reaches every worker within it.
POLICY_CACHE_S = env_int("POLICY_CACHE_S", 10, minimum=0)

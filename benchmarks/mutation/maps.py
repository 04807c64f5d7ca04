"""Which tests reach each module `bench mutation` mutates (TESTS_FOR)."""

from __future__ import annotations

# The tests that reach each module: the test files that exercise its code, directly or through the services
# that call it. Kept by hand beside the modules they guard; tests/foundation/test_mutation_bench.py checks that
# every path exists. `--tests` overrides the map for one run.
BILLING_METERING = (
    "tests/billing/test_billing_intervals_properties.py",
    "tests/billing/test_billing_health_credits.py",
    "tests/billing/test_billing_failed_provisioning.py",
    "tests/billing/test_billing_proration.py",
    "tests/billing/test_billing_month_boundary.py",
    "tests/billing/test_billing_catch_up.py",
    "tests/billing/test_billing_multi_cluster.py",
    "tests/billing/test_billing_statement_lines.py",
)
# The months people type (parse_period) and the overlap maths: their own tests first, then metering's.
BILLING_PERIODS = ("tests/billing/test_billing_periods.py", *BILLING_METERING)
# Metering also writes the showback figures (catch_up_measurements) and owns the watermark row. Its own tests go
# first: pytest runs with -x, so a mutant they kill stops there instead of after the whole map.
BILLING_METERING_OWN = (
    "tests/billing/test_billing_metering_edges.py",
    "tests/billing/test_billing_metering_watermark.py",
    "tests/billing/test_billing_showback.py",
    *BILLING_METERING,
)
# What metering measures (used seconds, energy, trespass seconds, health windows) is reached through metering's
# own tests and the trespass charge's, not through the interval maths alone.
BILLING_MEASUREMENTS = (
    "tests/billing/test_billing_measured_use.py",
    *BILLING_METERING_OWN,
    "tests/monitoring/test_monitoring_trespass_billing.py",
)
# The clock's edges (which states are failed now, a failure with no recorded start, a MIG unit withheld by its GPU's
# and its instance's events at once) first, then metering's.
BILLING_CLOCK = ("tests/billing/test_billing_clock_edges.py", *BILLING_METERING)
BILLING_STATEMENTS = (
    "tests/billing/test_billing_statement_lines.py",
    "tests/billing/test_billing_statement_edges.py",
    "tests/billing/test_billing_statement_grouping.py",
    "tests/billing/test_billing_tasks.py",
    "tests/billing/test_billing_intervals_properties.py",
    "tests/billing/test_billing_carry_over.py",
    "tests/billing/test_billing_unfinished_month.py",
    "tests/billing/test_billing_health_credits.py",
    "tests/billing/test_billing_failed_provisioning.py",
    "tests/billing/test_billing_adjustments.py",
    "tests/billing/test_billing_finalised_immutable.py",
    "tests/billing/test_billing_loans.py",
    "tests/billing/test_billing_showback.py",
)
BILLING_RATES = (
    "tests/billing/test_billing_price_services.py",
    "tests/billing/test_billing_intervals_properties.py",
    "tests/billing/test_billing_off_peak.py",
    "tests/billing/test_billing_rates.py",
    "tests/billing/test_billing_vgpu_rates.py",
    "tests/billing/test_billing_rate_change.py",
    "tests/billing/test_billing_statement_lines.py",
)
# Unit availability (free(), annotate_availability()) decides what approval may hand out and what the dashboard
# shows: approval, the dashboard's agreement with it, ending units and the demo world's figures reach it.
CAPACITY_AVAILABILITY = (
    "tests/capacity/test_availability_forms.py",
    "tests/pools/test_pools_approval.py",
    "tests/dashboard/test_dashboard_agrees_with_approval.py",
    "tests/pools/test_ending.py",
    "tests/capacity/test_demo_availability.py",
)
# Dedication and safety (#32): trespass and attribution, lending and reclaim, MIG layout and reconfiguration steps,
# the queue order and forecast.
TRESPASS = (
    "tests/monitoring/test_monitoring_trespass_fleet.py",
    "tests/monitoring/test_monitoring_trespass.py",
    "tests/monitoring/test_monitoring_trespass_activity.py",
    "tests/monitoring/test_monitoring_trespass_visibility.py",
    "tests/monitoring/test_monitoring_trespass_billing.py",
    "tests/capacity/test_podresources.py",
)
# Attribution's own world (two clusters, moved indexes, refused reports) first: it runs in seconds, the others
# start the simulator.
ATTRIBUTION = (
    "tests/capacity/test_inventory_attribution.py",
    "tests/capacity/test_podresources.py",
    "tests/capacity/test_discovery_inventory.py",
    "tests/capacity/test_discovery_workloads.py",
)
# Lending: the ORM-only tests first (what a reclaim takes back and evicts, against a recording cluster double; which
# idle unit goes to which request: seconds, no simulator), then the simulator's lend / reclaim / evict tests.
LENDING = (
    "tests/pools/test_lending_reclaim.py",
    "tests/pools/test_lending_matching.py",
    "tests/pools/test_lending.py",
    "tests/pools/test_lending_dra.py",
    "tests/pools/test_lending_idle.py",
    "tests/pools/test_borrowers.py",
    "tests/pools/test_best_effort.py",
    "tests/pools/test_loans_enforced.py",
)
MIG_LAYOUT = (
    "tests/capacity/test_mig_layout.py",
    "tests/capacity/test_mig_free_placements.py",
    "tests/capacity/test_mig_planner.py",
)
RECONFIGURATION_STEPS = (
    "tests/operations/test_reconfig_operator_backend.py",
    "tests/operations/test_reconfig_agent_backend.py",
    "tests/operations/test_reconfig_failures.py",
    "tests/operations/test_reconfig_reattach.py",
    "tests/operations/test_reconfig_refusals.py",
    "tests/capacity/test_reconfig_timeslicing.py",
    "tests/operations/test_reconfig_unkind_operator.py",
    "tests/operations/test_reconfig_manager_states.py",
)
QUEUE = (
    "tests/scheduling/test_queue_order_fleet.py",
    "tests/scheduling/test_queue.py",
    "tests/scheduling/test_forecast.py",
)
# Approval (#32): a request takes free units and becomes a pool. Approval's own tests first (pytest -x stops at
# the first failure), then spanning clusters, the capped choice of cluster, whole-GPU sets on one node and tiers.
APPROVAL = (
    "tests/pools/test_approval_records.py",
    "tests/pools/test_pools_approval.py",
    "tests/pools/test_pools_multi_cluster.py",
    "tests/pools/test_approval_picks.py",
    "tests/pools/test_pools_topology.py",
    "tests/pools/test_pools_tiers.py",
)
# Free units (read_free, the choice and spread of clusters): what approval counts and takes, for every spec kind
# (MIG, whole GPUs, time-slice and MPS replicas, vGPUs).
FREE_UNITS = (
    "tests/pools/test_free_units_counts.py",
    "tests/pools/test_approval_records.py",
    "tests/pools/test_pools_approval.py",
    "tests/pools/test_pools_multi_cluster.py",
    "tests/pools/test_approval_picks.py",
    "tests/pools/test_free_units_plan.py",
    "tests/pools/test_pools_topology.py",
    "tests/pools/test_pools_mps.py",
    "tests/pools/test_pools_vgpu.py",
    "tests/pools/test_pools_tiers.py",
)
# Approval taking units (pools/units/take.py): approval's own tests, whole-GPU sets on one node, whole nodes and
# GPUs first, spanning clusters, vGPU and time-slice shares, and moves off a node (away_from); then the picks.
# Its own tests first (pytest runs with -x).
TAKING = (
    "tests/pools/test_taking_units.py",
    "tests/pools/test_pools_approval.py",
    "tests/pools/test_pools_topology.py",
    "tests/pools/test_pools_dedicated_taints.py",
    "tests/pools/test_pools_multi_cluster.py",
    "tests/pools/test_pools_vgpu.py",
    "tests/pools/test_pools_mps.py",
    "tests/operations/test_drain_and_move.py",
    "tests/pools/test_approval_picks.py",
)
# Approval's capped counts and per-GPU MIG pick at fleet scale (capacity/picking.py): their own tests first
# (test_approval_picks_plan.py is PostgreSQL only: the benchmark's SQLite skips it).
PICKING = (
    "tests/pools/test_taking_units.py",
    "tests/pools/test_approval_picks.py",
    "tests/pools/test_pools_approval.py",
    "tests/pools/test_pools_dedicated_taints.py",
    "tests/pools/test_pools_multi_cluster.py",
)
# The forecast's own tests first (pytest -x: a mutant they kill stops there), then the what-if that replays its
# timeline and the queue's.
FORECAST = (
    "tests/scheduling/test_forecast_history.py",
    "tests/scheduling/test_forecast_demand.py",
    "tests/scheduling/test_forecast_units.py",
    "tests/scheduling/test_forecast_world.py",
    "tests/scheduling/test_forecast.py",
    "tests/scheduling/test_procurement.py",
    "tests/scheduling/test_queue_order_fleet.py",
    "tests/scheduling/test_queue.py",
)
TESTS_FOR: dict[str, tuple[str, ...]] = {
    "billing/services/intervals.py": BILLING_METERING,
    "billing/periods.py": BILLING_PERIODS,
    "billing/services/clock.py": BILLING_CLOCK,
    "billing/services/metering.py": BILLING_METERING_OWN,
    "billing/measurements.py": BILLING_MEASUREMENTS,
    "billing/services/lines.py": BILLING_STATEMENTS,
    "billing/services/statements.py": BILLING_STATEMENTS,
    "pricing/rates.py": BILLING_RATES,
    "pricing/services.py": BILLING_RATES,
    "billing/services/rate_cards.py": BILLING_RATES,
    "capacity/models/availability.py": CAPACITY_AVAILABILITY,
    "monitoring/services/trespass.py": TRESPASS,
    "capacity/services/inventory.py": ATTRIBUTION,
    "pools/lending.py": LENDING,
    "monitoring/services/lending.py": LENDING,
    "capacity/mig/layout.py": MIG_LAYOUT,
    "operations/reconfiguration/steps.py": RECONFIGURATION_STEPS,
    "scheduling/policy.py": QUEUE,
    "pools/services/approval.py": APPROVAL,
    "pools/units/free.py": FREE_UNITS,
    "pools/units/take.py": TAKING,
    "capacity/picking.py": PICKING,
    "scheduling/forecast/demand.py": FORECAST,
    "scheduling/forecast/history.py": FORECAST,
    "scheduling/forecast/timeline.py": FORECAST,
    "scheduling/forecast/estimate.py": FORECAST,
}

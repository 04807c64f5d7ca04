"""operations: the workflows that span capacity and pools on a node.

Owns MIG reconfiguration (operations.reconfiguration: plan, engine, steps, commands, outcomes), the take-offline
check, drain-and-move and rolling driver upgrades (operations.maintenance: check, steps, rollout, upgrades),
and rebalancing (operations.rebalancing). Its workflows write capacity's MigReconfiguration and NodeDrain rows
(leased steps, core.leases) and ask pools' services to move allocations; its own rows are DriverUpgrade and
DriverUpgradeNode (models). Tasks: the reconfiguration, drain and upgrade steps and their sweeps; the
capacity-plan, take-offline, rebalance, drain and upgrade admin pages and API are thin.

Layer: above monitoring, scheduling, pools, pricing, capacity, core and tenancy, which it may import; below
billing, notifications and gpuaas. capacity and pools never import it (tests/operations/test_operations_app.py):
capacity's node agent reports a MIG result through capacity.signals.mig_result_reported, answered by
operations.receivers (connected in OperationsConfig.ready()). It tells the layers above through
operations.signals.maintenance_notice (notifications).
"""

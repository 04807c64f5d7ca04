"""capacity: the fleet as it is, the rows of what is held, and the node workflows' tables.

Owns the inventory mirrored by discovery (Cluster, DiscoveryRun, ClusterOnboarding, NodeCapacity, GpuCapacity,
MigInstance, WorkloadProfile), the MIG catalog (MigProfile, MigPlacement; capacity.mig: layouts, planner,
share), MIG layouts, time-slicing policies, maintenance windows, tiers (TierProfilePolicy, TierAssignment),
the Allocation and SpecAndCount rows (what a unit is held by, below every app that reads "free"), and the
rows of the node workflows operations drives (MigReconfiguration, NodeDrain and their steps, on
core.leases.LeasedStep). Also the Kubernetes, NVML, CEL and PodResources adapters (adapters/), the node
agent (agent/), the services (discovery, inventory, planning, tiers, mig_configs, vgpu, onboarding), the
discovery, time-slicing, mig-parted and tier-label tasks, and the cluster, layout and onboarding admin.

Layer: above core.api and tenancy, below pricing and every other app. Imports core and tenancy only
(lint-imports keeps it so). It never calls the apps above it: it sends capacity.signals inside the
transaction that made the change (workloads_attributed for monitoring, instances_gone and
capacity_appeared for pools, mig_result_reported for operations), answered in their AppConfig.ready().
"""

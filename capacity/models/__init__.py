"""Capacity: clusters, GPU nodes and devices, MIG instances, offered specs and running workloads.

Names follow the seed product: NodeCapacity (a GPU node), GpuCapacity (a GPU device), SpecAndCount
(what a node offers, by spec), WorkloadProfile (the seed's "Profile": which pod runs on which GPU or
MIG instance). The cluster owns most of these facts; gpuaas mirrors them through discovery.

One module per domain; every model is importable from capacity.models.
"""

from .availability import UNSETTLED_MIG_STATES, USABLE_HEALTH
from .clusters import Cluster, ClusterOnboarding, DiscoveryRun
from .drains import NodeDrain, NodeDrainQuerySet, NodeDrainStep
from .inventory import GpuCapacity, GpuCapacityQuerySet, NodeCapacity, NodeCapacityQuerySet
from .layouts import GPUAAS_CONFIG_PREFIX, SHARING_POLICY_FIELDS, MigLayout, TimeSlicingPolicy
from .maintenance import MaintenanceWindow, MaintenanceWindowQuerySet
from .mig import MigInstance, MigInstanceQuerySet, MigPlacement, MigProfile
from .reconfiguration import (
    FORCE_PERMISSION,
    MigReconfiguration,
    MigReconfigurationQuerySet,
    MigReconfigurationStep,
)
from .reservations import SHARE_FIELDS, Allocation, AllocationQuerySet
from .specs import SpecAndCount, SpecAndCountQuerySet
from .tiers import TierAssignment, TierProfilePolicy
from .workloads import WorkloadProfile, WorkloadProfileQuerySet

__all__ = [
    "FORCE_PERMISSION",
    "SHARE_FIELDS",
    "Allocation",
    "AllocationQuerySet",
    "GPUAAS_CONFIG_PREFIX",
    "UNSETTLED_MIG_STATES",
    "USABLE_HEALTH",
    "Cluster",
    "ClusterOnboarding",
    "DiscoveryRun",
    "GpuCapacity",
    "GpuCapacityQuerySet",
    "MaintenanceWindow",
    "NodeDrain",
    "NodeDrainQuerySet",
    "NodeDrainStep",
    "MaintenanceWindowQuerySet",
    "MigInstance",
    "MigInstanceQuerySet",
    "MigLayout",
    "MigPlacement",
    "MigProfile",
    "MigReconfiguration",
    "MigReconfigurationQuerySet",
    "MigReconfigurationStep",
    "NodeCapacity",
    "NodeCapacityQuerySet",
    "SpecAndCount",
    "SpecAndCountQuerySet",
    "TierAssignment",
    "TierProfilePolicy",
    "TimeSlicingPolicy",
    "SHARING_POLICY_FIELDS",
    "WorkloadProfile",
    "WorkloadProfileQuerySet",
]

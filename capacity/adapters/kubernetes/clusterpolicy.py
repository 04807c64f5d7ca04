"""The GPU Operator's ClusterPolicy (nvidia.com/v1, cluster-scoped): what gpuaas reads of it.

Only `spec.driver.upgradePolicy` (DriverUpgradePolicySpec in NVIDIA/gpu-operator
api/nvidia/v1/clusterpolicy_types.go): `autoUpgrade` (the upgrade controller on or off) and
`maxParallelUpgrades` (how many nodes it upgrades at once; 0 means no limit, default 1). The list is read
through API discovery like any applied kind (apply.ApplyCalls), so a cluster without the operator's CRD
answers None instead of an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from .apply import ApplyCalls
from .errors import Invalid, NotFound

API_VERSION = "nvidia.com/v1"
KIND = "ClusterPolicy"


@dataclass(frozen=True)
class DriverUpgradePolicy:
    """The ClusterPolicy's driver upgrade policy as gpuaas uses it (fields absent: the CRD's defaults)."""

    policy_name: str
    auto_upgrade: bool
    max_parallel_upgrades: int  # 0: no limit


def parse_upgrade_policy(obj: dict) -> DriverUpgradePolicy:
    policy = ((obj.get("spec") or {}).get("driver") or {}).get("upgradePolicy") or {}
    return DriverUpgradePolicy(
        policy_name=(obj.get("metadata") or {}).get("name", ""),
        auto_upgrade=bool(policy.get("autoUpgrade", False)),
        max_parallel_upgrades=int(policy.get("maxParallelUpgrades", 1)),
    )


class ClusterPolicyCalls(ApplyCalls):
    def driver_upgrade_policy(self) -> DriverUpgradePolicy | None:
        """The first ClusterPolicy's driver upgrade policy (the operator reconciles exactly one); None when the
        cluster has no ClusterPolicy or does not serve the kind (GPU Operator not installed)."""
        try:
            plural, _ = self.resource_of(API_VERSION, KIND)
            listing = self._raw("list ClusterPolicy", "GET", f"/apis/{API_VERSION}/{plural}")
        except (Invalid, NotFound):
            return None
        items = sorted(listing.get("items") or (), key=lambda o: (o.get("metadata") or {}).get("name", ""))
        return parse_upgrade_policy(items[0]) if items else None

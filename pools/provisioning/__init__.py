"""Provisioning pools in Kubernetes, and undoing it after release.

What gpuaas writes, per (project, cluster), all through capacity/adapters/kubernetes/:

- the project's namespace (created if missing), annotated
  `scheduler.alpha.kubernetes.io/node-selector: gpuaas.io/project-<project id>=true`, so with the
  PodNodeSelector admission plugin its pods land only on nodes carrying the project's units;
- on every node carrying a unit of a held pool: the labels `gpuaas.io/pool-<pool id>=true` (target
  one pool with a nodeSelector) and `gpuaas.io/project-<project id>=true` (the namespace's selector).
  Keys, not values, carry the ids because one node may carry units of several pools and projects;
- one ResourceQuota `gpuaas-<pool id>` per held pool in that namespace. Kubernetes enforces every
  quota of a namespace independently (a pod must fit all of them), so each quota carries the
  namespace's total over all held pools of the project on that cluster: two pools of 2 x 3g.40gb
  give two quotas of `requests.nvidia.com/mig-3g.40gb: "4"`. GPU resources the nodes offer but the
  project was not granted are listed with "0", so the project cannot take a neighbour's units.
- on a DRA cluster (Cluster.binding, docs/dra.md), one ResourceClaimTemplate per held pool and unit kind,
  `gpuaas-<pool id>-gpu` / `gpuaas-<pool id>-mig-<profile>`, whose CEL selector admits only the UUIDs of
  the units the pool holds now: a pod that references it gets one of the pool's devices, never another's.
  Templates are immutable in Kubernetes, so a changed unit set (release, reconfiguration) is written as
  delete + create; claims already made from the old one keep their device until their pod ends.
- on every node whose held units all belong to one project: the taint `gpuaas.io/dedicated=project-<id>:NoSchedule`
  (removed once another project holds a unit there), and on the project's namespace the matching
  default toleration and the tolerations it may carry, through the PodTolerationRestriction admission
  plugin's annotations `scheduler.alpha.kubernetes.io/defaultTolerations` and
  `.../tolerationsWhitelist` (kubernetes plugin/pkg/admission/podtolerationrestriction): the device
  plugin binds by count, so only the taint keeps other projects' pods off a dedicated node. A node
  several projects share says so on their pools ("shared node: binding is by count", GpuPool.with_card).
- one ConfigMap `gpuaas-pool-<pool id>` per held pool in that namespace with the pool's scheduling
  (GpuPool.scheduling(): a node selector and the equivalent required node affinity on the pool's
  label and its tier's `gpuaas.io/tier`), for the team's pod specs; a released pool's is deleted.

A pool across clusters (PoolCluster rows, docs/pools.md) is written on each of its clusters with only
that cluster's units: reconcile(project, cluster) reads the pools on `cluster` (GpuPool.on_cluster) and
their allocations there. Provisioning and clean-up run cluster by cluster and record each one's outcome
on its PoolCluster.

`reconcile()` makes the cluster match the database and is idempotent: provisioning, retries and
clean-up after release all call it. Released pools lose their quota and pool label, and nodes
left with no unit of the project lose the project label; the namespace itself stays.

desired  what a (project, cluster) should hold, read from the database (Desired)
apply    writing it: reconcile(), provisioning and clean-up of a pool, repair of drift
"""

from .apply import (
    PartFailed,
    apply_claim_templates,
    deprovision_pool,
    provision_pool,
    reconcile,
    reconcile_provisioned,
    repair_drift,
)
from .desired import (
    ALLOWED_TOLERATIONS,
    BORROWED_PRIORITY,
    BORROWED_PRIORITY_CLASS,
    BORROWED_QUOTA,
    BORROWING_LABEL,
    DEDICATED_TAINT,
    DEFAULT_TOLERATIONS_ANNOTATION,
    DRA_CLASS,
    DRA_DRIVER,
    GPU_RESOURCE_PREFIXES,
    MANAGED_BY,
    POOL_LABEL,
    TOLERATIONS_WHITELIST_ANNOTATION,
    ClaimTemplate,
    Desired,
    borrowed_template_name,
    claim_template_spec,
    dedicated_taints,
    dedicated_value,
    desired_state,
    mps_environment,
    node_selector,
    placement_data,
    placement_name,
    project_label,
    toleration_annotations,
    uuid_selector,
)

__all__ = [
    "ALLOWED_TOLERATIONS",
    "BORROWED_PRIORITY",
    "BORROWED_PRIORITY_CLASS",
    "BORROWED_QUOTA",
    "BORROWING_LABEL",
    "ClaimTemplate",
    "DEDICATED_TAINT",
    "DEFAULT_TOLERATIONS_ANNOTATION",
    "DRA_CLASS",
    "DRA_DRIVER",
    "Desired",
    "GPU_RESOURCE_PREFIXES",
    "MANAGED_BY",
    "POOL_LABEL",
    "PartFailed",
    "TOLERATIONS_WHITELIST_ANNOTATION",
    "apply_claim_templates",
    "borrowed_template_name",
    "claim_template_spec",
    "dedicated_taints",
    "dedicated_value",
    "deprovision_pool",
    "desired_state",
    "mps_environment",
    "node_selector",
    "placement_data",
    "placement_name",
    "project_label",
    "provision_pool",
    "reconcile",
    "reconcile_provisioned",
    "repair_drift",
    "toleration_annotations",
    "uuid_selector",
]

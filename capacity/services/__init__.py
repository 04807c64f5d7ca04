"""Writes and workflows of the capacity app, one module per workflow.

- discovery: mirror a cluster's GPU nodes and what they offer (NodeCapacity, SpecAndCount) from
  the Kubernetes API, and track GPU workloads (WorkloadProfile).
- inventory: reconcile a node agent's NVML inventory into GpuCapacity and MigInstance rows.
- workloads: the pod -> WorkloadProfile part of discovery (a KubeVirt VM is its virt-launcher pod).
- vgpu: a vm-vgpu node's vGPU type (the vGPU device manager's ConfigMap and label).

Locking contract shared by all of them: every write phase runs in one transaction that first
takes the cluster's row lock (SELECT ... FOR NO KEY UPDATE on capacity_cluster), so the
mirror of one cluster is written by one transaction at a time and rows are never locked in
two different orders. Clusters never wait for each other.
"""

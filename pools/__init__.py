"""pools: projects' requests for GPUs, the pools they hold, and the units handed to them.

Owns PoolRequest and its transitions, GpuPool and PoolCluster, Loan, BestEffortRequest and Eviction, and the
queue's rows that scheduling works on (QueueEntry, QueueEvent, AutoApprovalPolicy, ProjectQueueWeight)
(models/). The services submit, approve, move and release (services/: requests, approval, allocations,
declarations); units/ answers what is free, how approval takes it and what the fleet could offer (with
pricing's prices); provisioning/ writes namespaces, quotas, labels and DRA claim templates in Kubernetes;
lending and ending handle loans and reservations whose pods must leave. Tasks: provisioning, expiry,
reconcile, loans and ending sweeps; admin/ and api/ are thin.

Layer: above pricing, capacity, core and tenancy, which it may import; below scheduling and everything
above. It hears from capacity through capacity.signals (receivers, connected in PoolsConfig.ready()). It
never imports scheduling, monitoring, billing or notifications: it sends pools.signals (queue_pass_wanted
and request_submitted for scheduling; request and allocation events, loan_reclaimed for notifications)
inside the transaction that made the change.
"""

"""The scheduler's policy: who waits, in what order, who is approved from the queue, and when a request would start.

scheduling owns the queue's rules (scheduling.policy.QueuePolicy: priority rank, aging, fair shares, spec
key, whether a request fits), the live queue pass and its operator actions (scheduling.queue), the auto-approval
policy book (scheduling.policies), the start forecast (scheduling.forecast, which runs the same QueuePolicy
forward), the procurement what-if (scheduling.procurement), the offers' start forecast (scheduling.offers),
and the queue's admin pages, API actions and beat tasks.

The rows stay in pools (QueueEntry, QueueEvent, AutoApprovalPolicy, ProjectQueueWeight, Loan): scheduling
imports pools, pricing, capacity, core and tenancy, and nothing above it (monitoring, operations, billing,
notifications, gpuaas) imports into it. pools never imports scheduling: where pools must reach the queue (a
queue pass after units came free, a request just submitted) it sends a pools.signals signal that
scheduling.receivers answers (connected in SchedulingConfig.ready()).
"""

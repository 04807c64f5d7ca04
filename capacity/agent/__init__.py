"""The thin node agent: NVML on a GPU node, nothing else.

A node agent is a Celery worker started with GPUAAS_ROLE=node-agent on the node's own queue
(`node.<cluster>.<node>`). It has no database (settings install Django's dummy engine, so any ORM
use raises) and no database credentials: it reads NVML through `capacity.adapters.nvml`, signs
what it read with its node's key (`protocol`) and publishes it on the control plane's ingest queue
(`transport`: a Redis stream, or a kombu queue on the embedded broker). The control plane checks the
signature against the node the report claims, maps readings to rows and writes many nodes in one COPY
(`monitoring.services.reports`).

- protocol: per-node keys (HMAC of the shared secret), the signed report envelope, readings to and
  from JSON;
- node: what the agent does for one node (read, sign), also called in-process by the control
  plane's embedded path, so both paths share one code path;
- transport: the ingest queue and publishing to it;
- tasks: the Celery tasks the agent serves.
"""

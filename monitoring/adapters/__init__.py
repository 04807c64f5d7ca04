"""Adapters of the monitoring app: one module per outside system (Prometheus text)."""

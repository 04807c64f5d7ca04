"""Adapters to outside systems: one module per system, and nothing else imports their libraries.

- kubernetes/: the Kubernetes API (the official client), one ApiClient per cluster.
- nvml/: NVML on a GPU node (pynvml, or the simulator's fake through settings.NVML_LIBRARY).
"""

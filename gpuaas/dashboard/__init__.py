"""The operator's GPU dashboard (in the admin) and the project view (for project members).

Read side only: every number comes from capacity, pools, monitoring and billing rows, assembled
here into JSON the pages render and refresh. Nothing in this package writes.

- status.py: what "In Use", "Ready" and "Available" mean, and the profile shapes 1g..7g / Full.
- fleet.py: cluster cards and the profile distribution, as SQL aggregates (a fixed number of queries).
- nodes.py: one cluster's node view and one GPU's MIG picture.
- sources.py: monitoring and billing reads (health counters, events, idle reservations, latest metrics, costs).
- timeseries.py: the charts' time series (per cluster, GPU and pool) from monitoring's 5-minute rollups.
- upgrades.py: the rolling driver upgrades under way (operations.models.DriverUpgrade).
- projects.py: a project member's projects, pools, requests and costs.
"""

"""Operator console: the approval queue, pools and their provisioning, allocations, project members.

State fields are read-only here; actions call the workflow services (pools/services/) and end
with a "N requests approved" message. Approve, reject and release ask for a reason on an
intermediate page first (actions.run_with_reason).

requests  the approval queue (pool requests)
pools     pools and allocations
loans     loans, evictions and best-effort requests (read-only)
"""

from . import loans, pools, requests  # noqa: F401  registers the model admins
from .actions import ReasonForm, run_with_reason
from .requests import PoolRequestAdmin

__all__ = ["PoolRequestAdmin", "ReasonForm", "run_with_reason"]

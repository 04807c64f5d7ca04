"""policies: the domain policy operators change in the admin, over the environment's defaults.

Owns `PolicyValue` (one row per setting an operator has changed) and `policy(name)`, the one way the apps read a
setting declared in `settings.POLICY`: the operator's value where one is set, else the setting (environment or
default). It may import Django only; every app above `capacity` reads it (import-linter's layers in pyproject.toml).
Deployment facts (intervals, addresses, timeouts) stay in the environment: they size processes at start-up.
"""

from .values import policy

__all__ = ["policy"]

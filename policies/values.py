"""Reading policy: one query per process every POLICY_CACHE_S, never one per read.

The hot paths (ingest's trespass check, the queue's ordering, the API's count check) read policy on every call,
so each process keeps the operators' values it last read and reads the table again when they are older than
POLICY_CACHE_S. A save or delete in this process drops its copy at once; other processes see it within
POLICY_CACHE_S.
"""

from __future__ import annotations

import logging
import math
import time

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, router
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

logger = logging.getLogger(__name__)

_overrides: dict[str, int | bool] = {}
_read_at: float | None = None  # time.monotonic() of the last read; None: read at the next use; inf: reset()'s


def policy(name: str) -> int | bool:
    """The value in force for `name`: the operator's, else the setting's."""
    if name not in settings.POLICY:
        raise ImproperlyConfigured(f"{name} is not declared in settings.POLICY")
    overrides = _overrides_now()
    return overrides[name] if name in overrides else getattr(settings, name)


def _overrides_now() -> dict[str, int | bool]:
    global _overrides, _read_at
    now = time.monotonic()
    if _read_at is None or now - _read_at >= settings.POLICY_CACHE_S:  # never after reset(overrides)
        from .models import PolicyValue

        try:
            _overrides = dict(PolicyValue.objects.values_list("name", "value"))
        except DatabaseError:
            # Outside a transaction (`check --deploy`, the schema, commands before `migrate`) the settings hold;
            # inside one the error is the caller's, as for any other query that fails there.
            if connections[router.db_for_read(PolicyValue)].in_atomic_block:
                raise
            logger.warning("policy: the policy table cannot be read (not migrated yet?); the settings hold")
            return _overrides
        _read_at = now
    return _overrides


def reset(overrides: dict[str, int | bool] | None = None) -> None:
    """Forget what this process read (None); or take `overrides` as the table's rows until the next save or delete.

    The suite passes {} before it collects and before each test: a fresh database holds no operator values,
    and modules that build the API schema at import must not need a database to learn that.
    """
    global _overrides, _read_at
    if overrides is None:
        _read_at = None
    else:
        _overrides, _read_at = dict(overrides), math.inf


@receiver([post_save, post_delete], sender="policies.PolicyValue", dispatch_uid="policies.forget")
def _forget(**kwargs) -> None:
    reset()

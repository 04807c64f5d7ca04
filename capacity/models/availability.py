"""The one definition of unit availability, shared by the GPU and MIG-instance querysets."""

from __future__ import annotations

from django.db.models import BooleanField, Case, CharField, Exists, ExpressionWrapper, Q, Value, When

from ..choices import Availability, GpuHealth
from .reservations import Allocation

# --- Unit availability: the one definition approval, take-offline, the planner hints and the dashboard use.
# A unit is a MIG instance, or a GPU with MIG off (a time-sliced GPU's replicas are counted by
# GpuCapacityQuerySet.with_free_replicas()). It is free when none of the states before FREE in
# choices.Availability applies. Each state is written once, as the Q a unit must satisfy to escape
# it: free() filters on them all (plain WHERE terms the planner can turn into anti-joins) and
# annotate_availability() names the first one that fails.

# nvidia.com/mig.config.state values of a node in the middle of a MIG change: its instances may vanish.
UNSETTLED_MIG_STATES = ("pending", "rebooting")
USABLE_HEALTH = (GpuHealth.OK, GpuHealth.WARNING)


def host_conditions(gpu: str = "") -> dict[str, Q]:
    """What the GPU at path `gpu` ("" or "gpu__") and its node must satisfy to escape each withholding state."""
    return {
        Availability.RECONFIGURING: ~Q(**{f"{gpu}node__mig_config_state__in": UNSETTLED_MIG_STATES}),
        Availability.CORDONED: Q(**{f"{gpu}node__ready": True, f"{gpu}node__cordoned": False}),
        Availability.WITHHELD: Q(**{f"{gpu}health__in": USABLE_HEALTH}),
    }


def availability_case(conditions: dict[str, Q], reserved: Exists, in_use: Q, ending: Exists) -> Case:
    whens = [
        When(in_use, then=Value(Availability.IN_USE)),
        When(reserved, then=Value(Availability.RESERVED)),
        When(ending, then=Value(Availability.ENDING)),
    ]
    whens += [When(~ok, then=Value(state)) for state, ok in conditions.items() if ok]
    return Case(*whens, default=Value(Availability.FREE), output_field=CharField())


# Per unit column: which allocations hold it. A whole GPU is held only by allocations without a MIG instance.
_WHOLE = {"gpu": {"mig_instance__isnull": True}, "mig_instance": {}}


def fleet_forms(model, unit: str, running, busy_devices: frozenset[str], within: dict | None = None) -> tuple[Q, Q, Q]:
    """(reserved, in_use, ending) of every unit of `model` as uncorrelated `pk IN (subquery)` terms.

    The same rows as the EXISTS forms the querysets use, written so that PostgreSQL hashes each subquery
    once (a hashed SubPlan) instead of probing an index per unit: what a count over all 300,000 units of a
    fleet needs (the dashboard's 15 s became a fraction of a second). `unit` is the allocations' and
    workloads' column naming the unit ("mig_instance" or "gpu"); `running` the running workloads. A whole GPU
    is held by allocations without a MIG instance (as the querysets' _reserved and _ending). NULLs are
    filtered out of each subquery, so a NOT IN never turns unknown.

    `within`: lookups on the unit (`{"gpu_id__in": ids}`, `{"node__cluster_id__in": ids}`) that the
    caller's units all satisfy (annotate_availability() filters them so): each subquery then reads the
    holders of those units only (the node view's page, one cluster) instead of every holder of the fleet.
    The same answer for each of those units.
    """
    column = f"{unit}_id"
    whole = _WHOLE[unit]  # a unit column it does not know is a caller's error, not "held by anything"
    scope = {f"{unit}__{lookup}": value for lookup, value in (within or {}).items()}

    def held(queryset, **extra) -> Q:
        return Q(pk__in=queryset.filter(**{f"{unit}__isnull": False}, **extra, **scope).values(column))

    in_use = held(running)
    if busy_devices:
        in_use |= Q(uuid__in=sorted(busy_devices))
    return held(Allocation.objects.active(), **whole), in_use, held(Allocation.objects.ending(), **whole)


def as_boolean(condition: Q) -> ExpressionWrapper:
    return ExpressionWrapper(condition, output_field=BooleanField())

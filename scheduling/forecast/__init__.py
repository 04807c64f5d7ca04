"""When would a request start? P50 and P90 of its start, for a queued request or one not yet submitted.

estimate_start(request_like) takes a PoolRequest, saved or not (the API's dry run builds an unsaved
one), and combines:

- what is known: units free now, the units each holding pool of the same spec gives back at its
  end date, cluster-wide maintenance windows (a start that falls in one moves to its close), and a
  MIG reconfiguration of idle GPUs that would make room (units.reconfiguration_hint, done within
  QUEUE_FORECAST_RECONFIGURATION_S);
- what is observed: for a pool without an end date, its remaining hold is drawn from the hold times
  of released pools of the same project and workload type (else the workload type, else all pools,
  else QUEUE_FORECAST_DEFAULT_HOLD_H), given how long it has held already;
- the queue: the units that requests ahead of it (same spec, scheduling/policy.py) will take first,
  and the requests expected to arrive while it waits that would rank ahead of it: those of its spec
  submitted over the last QUEUE_FORECAST_ARRIVALS_WINDOW_H of a higher priority class, or of its class
  from projects whose fair share is now below its project's, arriving at the rate seen then (a Poisson
  process in each draw, sizes drawn from those seen);
- topology: a multi-GPU whole-GPU request starts only when one node has its count free
  (pools/units/topology.py), so units are followed per node.

QUEUE_FORECAST_DRAWS draws of that timeline (seeded, so one state gives one answer) give the start's
distribution; P50 and P90 are its quantiles. A request no unit would ever serve under the tier profile policy
(units.verdict) has no start ("never: tier 1 takes 3g and larger: ..."); units the policy withholds are
never counted as free, and are named in the basis ("withheld"). A start no draw reaches (more than the fleet holds)
is None. Accuracy is scored against actual starts by accuracy().
"""

from .demand import Arrival, Arrivals, KnownArrivals, Waiting, arrivals, queue_ahead
from .estimate import Forecast, Plan, accuracy, estimate_start, plan, quantiles
from .history import Holder, Survival, hold_history, hold_samples, holders
from .timeline import Timeline, Units

__all__ = [
    "Arrival",
    "Arrivals",
    "Forecast",
    "Holder",
    "KnownArrivals",
    "Plan",
    "Survival",
    "Timeline",
    "Units",
    "Waiting",
    "accuracy",
    "arrivals",
    "estimate_start",
    "hold_history",
    "hold_samples",
    "holders",
    "plan",
    "quantiles",
    "queue_ahead",
]

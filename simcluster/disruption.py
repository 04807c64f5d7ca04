"""PodDisruptionBudgets (policy/v1) and the eviction subresource's check, as kube-apiserver makes it.

What the real API server does (Kubernetes documentation, "API-initiated Eviction", v1.34: an eviction is a
policy-controlled DELETE; 200/201 when allowed, 429 Too Many Requests while a PodDisruptionBudget forbids it,
500 when more than one budget selects the pod), reduced to what gpuaas relies on:

- a pod that is not Running (Pending, Succeeded, Failed) or already terminating is evicted without a check;
- the budgets of the pod's namespace whose `spec.selector` (matchLabels, matchExpressions) selects it: none,
  the pod is evicted; more than one, 500; one, the disruptions it allows now are computed from the pods it
  selects: `minAvailable` (a count or a percentage of the selected pods, rounded up) -> healthy - min;
  `maxUnavailable` -> max - (selected - healthy); healthy = selected pods Running and not terminating.
  Zero or less: 429 with the message and DisruptionBudget cause kube-apiserver sends.

The disruption controller's status (disruptionsAllowed, observedGeneration) is not kept: it is computed
at each eviction, as if the controller were never late.
"""

from __future__ import annotations

import math

API_VERSION = "policy/v1"


def _int_or_percent(value, total: int, *, round_up: bool) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.endswith("%") and value[:-1].isdigit():
        share = int(value[:-1]) * total / 100
        return math.ceil(share) if round_up else math.floor(share)
    return None


def validate(obj: dict) -> list[tuple[str, str]]:
    spec = obj.get("spec") or {}
    problems = []
    given = [k for k in ("minAvailable", "maxUnavailable") if k in spec]
    if len(given) > 1:
        problems.append(("spec", "Invalid value: minAvailable and maxUnavailable cannot be both set"))
    for key in given:
        if _int_or_percent(spec[key], 100, round_up=True) is None:
            problems.append((f"spec.{key}", "Invalid value: must be an integer or a percentage"))
    if not isinstance(spec.get("selector") or {}, dict):
        problems.append(("spec.selector", "Invalid value: must be a label selector"))
    return problems


def _selects(selector: dict | None, labels: dict) -> bool:
    """A LabelSelector (policy/v1: a null selector selects nothing, an empty one every pod)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _healthy(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")


def check_eviction(cluster, namespace: str, pod: dict) -> None:
    """Raise the API server's refusal when the budgets forbid evicting `pod` now; return otherwise."""
    from .kube import ApiError

    if not _healthy(pod):
        return
    labels = pod["metadata"].get("labels") or {}
    budgets = [
        record.obj
        for (ns, _), record in sorted(cluster.poddisruptionbudgets.items())
        if ns == namespace and _selects((record.obj.get("spec") or {}).get("selector"), labels)
    ]
    if not budgets:
        return
    if len(budgets) > 1:
        raise ApiError(
            500,
            "InternalError",
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        )
    budget = budgets[0]
    spec = budget.get("spec") or {}
    selected = [
        record.obj
        for (ns, _), record in cluster.pods.items()
        if ns == namespace
        and (record.obj.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and _selects(spec.get("selector"), record.obj["metadata"].get("labels") or {})
    ]
    healthy = sum(1 for p in selected if _healthy(p))
    if "maxUnavailable" in spec:
        allowed = _int_or_percent(spec["maxUnavailable"], len(selected), round_up=False) - (len(selected) - healthy)
        need = len(selected) - _int_or_percent(spec["maxUnavailable"], len(selected), round_up=False)
    else:
        need = _int_or_percent(spec.get("minAvailable", 1), len(selected), round_up=True)
        allowed = healthy - need
    if allowed > 0:
        return
    name = budget["metadata"]["name"]
    raise ApiError(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
        {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": f"The disruption budget {name} needs {need} healthy pods and has {healthy} currently",
                }
            ]
        },
    )

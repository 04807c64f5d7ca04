"""CEL in the simulated kube-apiserver, through a maintained CEL implementation: common-expression-language
(PyPI `common-expression-language`, Python bindings of the Rust `cel` crate, cel-rust/cel).

kube-apiserver evaluates CEL with cel-go; here the same expressions run through that library: DRA device
selectors (DeviceClass and ResourceClaim/Template `selectors[].cel.expression`, simcluster/dra.py) and the
ValidatingAdmissionPolicy that deploy/ ships (simcluster/admission.py). It was chosen over cel-python 0.5.0
after both ran the forms gpuaas's policy and selectors use (`request.userInfo.username`, `has()`,
`object.spec.devices.requests.exists(...)`, `in` on lists and maps, `device.attributes["<domain>"].<name>`):
both evaluated all of them alike; this one is a compiled library (about 60 µs per selector evaluation
against about 800 µs), and it reports which variables and functions an expression references, which is
how a selector naming anything but `device` is refused at write time as kube-apiserver's type check does.

What neither library has of Kubernetes' CEL environment: the optional-field syntax (`object.?spec`), the
Kubernetes libraries (`quantity()`, `semver()`, `isSorted()`, `url()`, `ip()`, `cidr()`, `authorizer`)
and cel-go's strings extension (`lowerAscii`, `split`, `join`...). An expression using them is refused
when the object carrying it is written (422 naming why), never admitted silently.
"""

from __future__ import annotations

import functools
import re

import cel

# The fields of the `device` variable in a DRA selector (k8s.io/dynamic-resource-allocation/cel: driver,
# attributes, capacity, allowMultipleAllocations): kube-apiserver's type check refuses any other.
DEVICE_FIELDS = frozenset({"driver", "attributes", "capacity", "allowMultipleAllocations"})
_DEVICE_FIELD = re.compile(r"\bdevice\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")
_UNDEFINED = "Undefined variable or function"
_MACRO_BINDING = re.compile(r"\.\s*(?:exists|all|exists_one|map|filter)\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,")
_EMPTY_DEVICE = {"driver": "", "attributes": {}, "capacity": {}, "allowMultipleAllocations": False}


class CelError(ValueError):
    """An expression that does not compile, or that references what its environment does not declare."""


class EvalError(RuntimeError):
    """An expression that failed while it ran (a missing field or key, a type mismatch)."""


@functools.lru_cache(maxsize=4096)
def program(expression: str) -> cel.Program:
    """The compiled expression (cached: the allocator evaluates the same selectors on every node)."""
    if not isinstance(expression, str) or not expression.strip():
        raise CelError("expression is required")
    try:
        return cel.compile(expression)
    except ValueError as exc:
        raise CelError(str(exc).splitlines()[0]) from None


def declared(expression: str, variables: frozenset[str] | set[str]) -> cel.Program:
    """Compile `expression` and refuse a top-level reference outside `variables`.

    The library binds comprehension variables (`r` in `requests.exists(r, ...)`) as variables too, so a
    name that is neither declared nor bound by a macro in the text is what is refused.
    """
    compiled = program(expression)
    bound = set(_MACRO_BINDING.findall(expression))
    unknown = sorted(set(compiled.variables()) - set(variables) - bound)
    if unknown:
        raise CelError(f"undeclared reference to {', '.join(repr(u) for u in unknown)}")
    return compiled


def evaluate(expression: str, variables: dict):
    """Run a compiled expression; EvalError when it fails (kube-apiserver's runtime error)."""
    try:
        return program(expression).execute(variables)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        text = str(exc)
        if isinstance(exc, KeyError):
            text = f"no such key: {exc.args[0]}"
        raise EvalError(text) from None


def device_selector(expression: str) -> cel.Program:
    """A DRA device selector as kube-apiserver compiles it: only `device` and its declared fields, a bool result.

    A function the library lacks (a Kubernetes library function) is found by one trial run on an empty device:
    the library says "Undefined variable or function" for it; any other runtime error there (a missing
    attribute) is the selector's business at allocation time, as in Kubernetes.
    """
    compiled = declared(expression, {"device"})
    fields = set(_DEVICE_FIELD.findall(expression)) - DEVICE_FIELDS
    if fields:
        raise CelError(f"undefined field {', '.join(repr(f) for f in sorted(fields))} of device")
    try:
        compiled.execute({"device": _EMPTY_DEVICE})
    except RuntimeError as exc:
        if str(exc).startswith(_UNDEFINED):
            raise CelError(str(exc).split(".")[0]) from None
    except (KeyError, TypeError, ValueError):
        pass
    return compiled


def device_activation(driver: str, device: dict) -> dict:
    """The `device` variable for one ResourceSlice device: `attributes` and `capacity` keyed by domain (an
    unqualified name is the driver's), each attribute's typed value unwrapped (string, int, bool, version)."""
    attributes: dict[str, dict] = {}
    for name, value in (device.get("attributes") or {}).items():
        domain, _, short = name.rpartition("/")
        if isinstance(value, dict) and value:
            attributes.setdefault(domain or driver, {})[short] = next(iter(value.values()))
    capacity: dict[str, dict] = {}
    for name, value in (device.get("capacity") or {}).items():
        domain, _, short = name.rpartition("/")
        quantity = value.get("value") if isinstance(value, dict) else value
        capacity.setdefault(domain or driver, {})[short] = quantity
    return {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
    }

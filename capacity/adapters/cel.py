"""CEL, the expression language of DRA device selectors, through a maintained implementation: the
common-expression-language library (Python bindings of the Rust `cel` crate; the simulator's kube-apiserver
uses the same library, simcluster/cel.py). Nothing else in gpuaas imports it.

gpuaas writes one kind of CEL: the selector of each ResourceClaimTemplate it holds for a pool
(pools/provisioning/, docs/dra.md), `device.attributes["gpu.nvidia.com"].uuid in [...]`. Before such a
selector is written, `checked_device_selector` proves three things with the library, so a template the API
server would refuse, or one that admits a device the pool does not hold, is never written:
- it compiles, and references nothing but `device` (kube-apiserver's type check declares only that variable);
- run against a device carrying each UUID the pool holds, it is true;
- run against a device carrying any other UUID of the same driver, it is false.
"""

from __future__ import annotations

import functools

import cel


class SelectorError(ValueError):
    """A selector that does not compile, references more than `device`, or admits other devices than meant."""


@functools.lru_cache(maxsize=1024)
def _program(expression: str) -> cel.Program:
    try:
        return cel.compile(expression)
    except ValueError as exc:
        raise SelectorError(f"{expression!r} does not compile: {str(exc).splitlines()[0]}") from None


def _device(driver: str, uuid: str) -> dict:
    """A device as a DRA selector sees it (k8s.io/dynamic-resource-allocation/cel): attributes by domain."""
    return {"driver": driver, "attributes": {driver: {"uuid": uuid}}, "capacity": {}, "allowMultipleAllocations": False}


def admits(expression: str, driver: str, uuid: str) -> bool:
    """Whether the selector admits a device of `driver` with this UUID (an evaluation error admits nothing)."""
    try:
        return _program(expression).execute({"device": _device(driver, uuid)}) is True
    except (KeyError, TypeError, ValueError, RuntimeError):
        return False


def checked_device_selector(expression: str, *, driver: str, admitted: list[str], refused: list[str]) -> str:
    """`expression`, once the library has shown it admits every UUID of `admitted` and none of `refused`.
    Raises SelectorError naming the first thing wrong."""
    program = _program(expression)
    extra = sorted(set(program.variables()) - {"device"})
    if extra:
        raise SelectorError(f"{expression!r} references {', '.join(extra)}: a device selector declares only device")
    missed = [u for u in admitted if not admits(expression, driver, u)]
    if missed:
        raise SelectorError(f"{expression!r} does not admit {missed[0]}")
    leaked = [u for u in refused if admits(expression, driver, u)]
    if leaked:
        raise SelectorError(f"{expression!r} also admits {leaked[0]}")
    return expression

"""The simulated GPU hardware: physical GPUs, MIG GPU/compute instances and their metrics.

This is the "silicon and driver" layer. It knows MIG geometry (from capacity.mig.catalog),
placement rules, GI-ID assignment and the metric model, and nothing about Kubernetes.
Errors are raised as `HardwareError(code)` carrying the NVML return code the real driver
would give, so the fake NVML can hand them straight to pynvml's own exception classes.

Conventions that follow ../shared/reference/nvidia.md:
- placement = (start, size) in memory slices (§1.1); a GI may not overlap another GI;
- GI IDs as observed on A100/H100 (§1.6): 7g -> 0, 1-slice at start s -> 7+s,
  2-slice at s -> 3+s/2, 4-slice -> 1 or 2 (first free);
- default placement order when none is given (§1.6): 1-slice GIs fill 6,4,5,0,1,2,3;
  2-slice prefer 6,4,2,0 (filtered by the profile's valid starts, so a 2g lands at 4);
  4-slice prefer 4 then 0.
A30 (4 memory slices) has no observed GI-ID pattern; the analogous rule is used
(full -> 0, 2-slice -> 1+s/2, 1-slice -> 3+s) and documented as invented.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field

from capacity.mig.catalog import CI_PROFILE_BY_SLICES, PRODUCTS, Product, Profile

# NVML return codes used here (values from nvml.h / pynvml; kept local so this module
# does not need pynvml loaded).
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23

# Clock event reasons (nvml.h nvmlClocksEventReason*).
CLOCKS_EVENT_GPU_IDLE = 0x1
CLOCKS_EVENT_SW_THERMAL = 0x20
CLOCKS_EVENT_HW_THERMAL = 0x40

_DEFAULT_ORDER_8 = {1: (6, 4, 5, 0, 1, 2, 3), 2: (6, 4, 2, 0), 4: (4, 0), 8: (0,)}
_DEFAULT_ORDER_4 = {1: (3, 2, 1, 0), 2: (2, 0), 4: (0,)}


class HardwareError(Exception):
    """An operation the real driver would refuse; `code` is the NVML return code."""

    def __init__(self, code: int, message: str = ""):
        super().__init__(message or f"NVML error {code}")
        self.code = code


def stable_hex(*parts: object) -> str:
    """Deterministic hex digest of the parts; the seed of every simulated identifier."""
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()


def uuid_from(*parts: object, version: int = 4) -> str:
    """An 8-4-4-4-12 UUID string derived deterministically from the parts."""
    h = stable_hex(*parts)
    variant = "89ab"[int(h[16], 16) % 4]
    return f"{h[:8]}-{h[8:12]}-{version}{h[13:16]}-{variant}{h[17:20]}-{h[20:32]}"


# What an idle unit reads from NVML (no process on it), per product: tests/fixtures/nvml/ and docs/simcluster.md
# ("Idle readings") give the sources. Whole GPUs: the driver's reservation (`nvidia-smi -q` "FB Memory Usage /
# Reserved", NVML's nvmlMemory_v2 `.reserved`) and the power draw of a recorded idle board (P0, 345 MHz SM clock).
# MIG devices: the memory a MIG device reports in use with no process on it (a recorded `nvidia-smi` MIG table of
# an H100 80GB HBM3, driver 535.104.12); 4g.40gb is an inference (the 3g.40gb figure: same memory slices).
IDLE_RESERVED_MIB = {"H100-80GB": 454, "H100-94GB-NVL": 594, "H200-141GB": 700}
IDLE_MIG_USED_MIB = {
    ("H100-80GB", "1g.10gb"): 12,
    ("H100-80GB", "2g.20gb"): 25,
    ("H100-80GB", "3g.40gb"): 37,
    ("H100-80GB", "4g.40gb"): 37,
}
IDLE_POWER_W = {"H100-80GB": 100.89, "H100-94GB-NVL": 61.62, "H200-141GB": 74.58}
# Products without a recorded idle board (inferences, not sourced): the H100/H200 reservation is 0.5-0.6 % of the
# board's memory and an idle MIG device holds about 1 MiB per 830 MiB of its memory; idle power 10 % of the limit.
_RESERVED_SHARE = 0.0055
_MIG_MIB_PER_RESERVED_MIB = 830


def reserved_mib(product: Product, profile: Profile | None = None) -> int:
    """Memory the driver itself holds on an idle unit (a whole GPU, or a MIG device of `profile`), MiB."""
    if profile is not None:
        known = IDLE_MIG_USED_MIB.get((product.key, profile.name))
        return known if known is not None else max(1, round(profile.memory_mib / _MIG_MIB_PER_RESERVED_MIB))
    known = IDLE_RESERVED_MIB.get(product.key)
    return known if known is not None else round(product.memory_mib * _RESERVED_SHARE)


def idle_power_w(product: Product) -> float:
    return IDLE_POWER_W.get(product.key, 0.1 * product.power_limit_w)


# The character of a workload, from its pod's `gpuaas.io/workload-type` label (gpuaas's WorkloadType
# values); a pod without one runs as "batch".
WORKLOAD_TYPE_LABEL = "gpuaas.io/workload-type"
CHARACTERS = ("training", "inference", "development", "staging", "batch")


@dataclass
class LoadModel:
    """How busy one compute unit (a full GPU or a GPU instance) is over simulated time.

    Activity follows the work placed on the unit: a unit with no pod reads 0 (nothing runs); a unit
    with a pod reads by the workload's character (training 75-97 %, inference moderate and
    bursty 15-70 %, development/notebooks 8-30 %, batch and staging busy 55-95 %). `level`,
    `period` and `phase` are seeded per unit, so two units with the same work differ, and the
    waves are slow (15-60 min) so consecutive polls read alike. A pure function of (t, work):
    the demo's seeded history is computed from it too.
    """

    kind: str  # the unit's personality for unlabelled work: busy | bursty
    level: float  # 0..1, where in its band this unit sits
    period: float  # seconds of simulated time
    phase: float

    @classmethod
    def seeded(cls, *key: object) -> LoadModel:
        digest = stable_hex("load", *key)
        kind_f, level, period, phase = (int(digest[i : i + 12], 16) / float(1 << 48) for i in range(0, 48, 12))
        return cls(
            kind="busy" if kind_f < 0.6 else "bursty",
            level=level,
            period=900.0 + 2700.0 * period,
            phase=2 * math.pi * phase,
        )

    def activity(self, t: float, work: str | None) -> float:
        """SM activity in [0, 1] at simulated time t with `work` (a character, or None: nothing runs)."""
        wave = math.sin(2 * math.pi * t / self.period + self.phase)
        fast = math.sin(2 * math.pi * t / (self.period / 5) + 2 * self.phase)
        if work is None:
            return 0.0
        if work == "training":
            value = 0.82 + 0.1 * self.level + 0.05 * wave
        elif work == "inference" or (work == "batch" and self.kind == "bursty"):
            value = 0.38 + 0.1 * self.level + 0.15 * wave + 0.06 * fast
        elif work == "development":
            value = 0.16 + 0.06 * self.level + 0.06 * wave
        else:  # batch, staging
            value = 0.68 + 0.18 * self.level + 0.08 * wave
        return min(1.0, max(0.0, value))


def ci_starts(gi_slices: int, slices: int) -> tuple[int, ...]:
    """Valid starts (in compute slices) of a `slices`-slice CI inside a `gi_slices` GI (§1.3):
    1c at 0..G-1; 2c at {0,2,4} in 7g, {0,2} in 4g, {0} in 3g/2g; 3c at {0,4} in 7g, {0} in
    3g; 4c at {0} in 4g/7g; the full size at {0}."""
    if slices not in CI_PROFILE_BY_SLICES or slices > gi_slices:
        return ()
    if slices == gi_slices:
        return (0,)
    if slices == 3:
        return tuple(s for s in (0, 4) if s + 3 <= gi_slices) if gi_slices in (3, 7) else ()
    if slices == 4 and gi_slices not in (4, 7):
        return ()
    return tuple(range(0, gi_slices - slices + 1, slices))


def remaining_capacity(product: Product, profile: Profile, existing: list[tuple[Profile, int]]) -> int:
    """How many more GIs of `profile` fit beside `existing` [(profile, start)] on a MIG GPU.

    Bounded by the profile's max count, the GPU's max GIs, free compute slices and free
    memory-slice placements (placements are aligned, so greedy by start is optimal).
    """
    same = sum(1 for p, _ in existing if p is profile)
    used_compute = sum(p.compute_slices for p, _ in existing)
    limit = min(
        profile.max_instances - same,
        product.max_gpu_instances - len(existing),
        (product.compute_slices - used_compute) // profile.compute_slices,
    )
    taken = [(start, start + p.memory_slices) for p, start in existing]
    fits, until = 0, -1
    for start in sorted(profile.starts):
        end = start + profile.memory_slices
        if start >= until and all(end <= a or start >= b for a, b in taken):
            fits += 1
            until = end
    return max(0, min(limit, fits))


@dataclass(eq=False)
class ComputeInstance:
    id: int
    slices: int  # compute slices
    start: int  # in compute slices, within the GI
    uuid: str

    @property
    def profile_id(self) -> int:
        return CI_PROFILE_BY_SLICES[self.slices]


@dataclass(eq=False)
class GpuInstance:
    id: int
    profile: Profile
    start: int
    serial: int  # creation serial; makes stale NVML handles detectable
    load: LoadModel
    compute_instances: dict[int, ComputeInstance] = field(default_factory=dict)
    activity: float = 0.0

    @property
    def end(self) -> int:
        return self.start + self.profile.memory_slices

    def ci_placements(self, slices: int) -> tuple[int, ...]:
        return ci_starts(self.profile.compute_slices, slices)

    def full_ci(self) -> ComputeInstance | None:
        """The CI spanning the whole GI: what the device plugin advertises as a MIG device."""
        for ci in self.compute_instances.values():
            if ci.slices == self.profile.compute_slices:
                return ci
        return None


@dataclass(eq=False)
class Gpu:
    """One physical GPU as the driver sees it."""

    index: int
    product: Product
    uuid: str
    serial: str
    pci_bus_id: str
    load: LoadModel
    mig_current: int = 0
    mig_pending: int = 0
    instances: dict[int, GpuInstance] = field(default_factory=dict)
    lost: bool = False
    ecc_corrected_volatile: int = 0
    ecc_uncorrected_volatile: int = 0
    ecc_corrected_aggregate: int = 0
    ecc_uncorrected_aggregate: int = 0
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    thermal_throttle: bool = False
    nvlink_down: bool = False  # its NVLinks inactive (a failed NVSwitch tray or bridge): a fault to inject
    energy_mj: float = 0.0
    power_w: float = 0.0
    temperature_c: int = 30
    activity: float = 0.0
    _serials: int = 0

    # --- static facts -------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.product.model_name

    @property
    def pci_device_id(self) -> int:
        """NVML pciDeviceId: device << 16 | vendor (0x10DE)."""
        return (self.product.pci_device_id << 16) | 0x10DE

    @property
    def mig_enabled(self) -> bool:
        return self.mig_current == 1

    def profile_by_id(self, profile_id: int) -> Profile:
        profile = self.product.by_id.get(profile_id)
        if profile is None:
            raise HardwareError(NVML_ERROR_INVALID_ARGUMENT, f"no GPU instance profile id {profile_id}")
        return profile

    # --- MIG geometry ---------------------------------------------------------------------

    def _free(self, start: int, size: int, ignore: GpuInstance | None = None) -> bool:
        end = start + size
        return all(gi is ignore or end <= gi.start or start >= gi.end for gi in self.instances.values())

    def _default_order(self, profile: Profile) -> tuple[int, ...]:
        table = _DEFAULT_ORDER_8 if self.product.memory_slices == 8 else _DEFAULT_ORDER_4
        preferred = [s for s in table.get(profile.memory_slices, ()) if s in profile.starts]
        return tuple(preferred + [s for s in profile.starts if s not in preferred])

    def _gi_id_for(self, profile: Profile, start: int) -> int:
        size, total = profile.memory_slices, self.product.memory_slices
        used = set(self.instances)
        if total == 8:
            if size == 8:
                return 0
            if size == 1:
                return 7 + start
            if size == 2:
                return 3 + start // 2
            candidates = [1, 2]
        else:  # 4-slice parts (A30): invented analogue, see module docstring
            if size == 4:
                return 0
            if size == 2:
                return 1 + start // 2
            return 3 + start
        for gi_id in candidates:
            if gi_id not in used:
                return gi_id
        raise HardwareError(NVML_ERROR_INSUFFICIENT_RESOURCES, "no free GPU instance id")

    def _check_can_add(self, profile: Profile) -> None:
        same = sum(1 for gi in self.instances.values() if gi.profile is profile)
        if same >= profile.max_instances:
            raise HardwareError(NVML_ERROR_INSUFFICIENT_RESOURCES, f"{profile.name}: at most {profile.max_instances}")
        if len(self.instances) >= self.product.max_gpu_instances:
            raise HardwareError(NVML_ERROR_INSUFFICIENT_RESOURCES, "maximum GPU instances reached")
        used_compute = sum(gi.profile.compute_slices for gi in self.instances.values())
        if used_compute + profile.compute_slices > self.product.compute_slices:
            raise HardwareError(NVML_ERROR_INSUFFICIENT_RESOURCES, "not enough compute slices")

    def remaining_capacity(self, profile: Profile) -> int:
        """How many more GIs of `profile` fit now (NVML RemainingCapacity)."""
        if not self.mig_enabled:
            return 0
        return remaining_capacity(self.product, profile, [(gi.profile, gi.start) for gi in self.instances.values()])

    def create_gpu_instance(self, profile: Profile, start: int | None = None, *, uuid_seed: object = "") -> GpuInstance:
        """Create a GI (without compute instances, as NVML does)."""
        if not self.mig_enabled:
            raise HardwareError(NVML_ERROR_NOT_SUPPORTED, "MIG mode is disabled")
        self._check_can_add(profile)
        if start is None:
            start = next((s for s in self._default_order(profile) if self._free(s, profile.memory_slices)), None)
            if start is None:
                raise HardwareError(NVML_ERROR_INSUFFICIENT_RESOURCES, "no free placement")
        elif start not in profile.starts:
            raise HardwareError(NVML_ERROR_INVALID_ARGUMENT, f"{profile.name} cannot start at {start}")
        elif not self._free(start, profile.memory_slices):
            raise HardwareError(NVML_ERROR_INSUFFICIENT_RESOURCES, f"placement {start}:{profile.memory_slices} busy")
        gi_id = self._gi_id_for(profile, start)
        self._serials += 1
        gi = GpuInstance(
            id=gi_id,
            profile=profile,
            start=start,
            serial=self._serials,
            load=LoadModel.seeded(self.uuid, "gi", gi_id, self._serials, uuid_seed),
        )
        self.instances[gi_id] = gi
        return gi

    def create_compute_instance(self, gi: GpuInstance, slices: int, start: int | None = None) -> ComputeInstance:
        placements = gi.ci_placements(slices)
        if not placements:
            raise HardwareError(NVML_ERROR_NOT_SUPPORTED, f"no {slices}-slice CI profile in {gi.profile.name}")
        if sum(c.slices for c in gi.compute_instances.values()) + slices > gi.profile.compute_slices:
            raise HardwareError(NVML_ERROR_INSUFFICIENT_RESOURCES, "GPU instance has no free compute slices")

        def free(s: int) -> bool:
            return all(s + slices <= c.start or s >= c.start + c.slices for c in gi.compute_instances.values())

        if start is None:
            start = next((s for s in placements if free(s)), None)
            if start is None:
                raise HardwareError(NVML_ERROR_INSUFFICIENT_RESOURCES, "no free CI placement")
        elif start not in placements:
            raise HardwareError(NVML_ERROR_INVALID_ARGUMENT, f"CI cannot start at {start}")
        elif not free(start):
            raise HardwareError(NVML_ERROR_INSUFFICIENT_RESOURCES, "CI placement busy")
        ci_id = next(i for i in range(8) if i not in gi.compute_instances)
        ci = ComputeInstance(
            id=ci_id,
            slices=slices,
            start=start,
            uuid="MIG-" + uuid_from(self.uuid, gi.id, gi.serial, ci_id, version=5),
        )
        gi.compute_instances[ci_id] = ci
        return ci

    def destroy_compute_instance(self, gi: GpuInstance, ci_id: int) -> None:
        if gi.compute_instances.pop(ci_id, None) is None:
            raise HardwareError(NVML_ERROR_NOT_FOUND, f"no compute instance {ci_id}")

    def destroy_gpu_instance(self, gi_id: int) -> None:
        gi = self.instances.get(gi_id)
        if gi is None:
            raise HardwareError(NVML_ERROR_NOT_FOUND, f"no GPU instance {gi_id}")
        if gi.compute_instances:
            raise HardwareError(NVML_ERROR_IN_USE, "destroy the compute instances first")
        del self.instances[gi_id]

    def set_mig_mode(self, mode: int, *, in_use: bool) -> int:
        """Request MIG on/off; returns the activation status NVML reports.

        Busy GPUs only record the pending mode (NVML_ERROR_IN_USE as activation status),
        like a GPU that needs a reset. Disabling with GIs present is refused.
        """
        if mode not in (0, 1):
            raise HardwareError(NVML_ERROR_INVALID_ARGUMENT, "mode must be 0 or 1")
        if mode == 0 and self.instances:
            raise HardwareError(NVML_ERROR_IN_USE, "GPU instances exist")
        self.mig_pending = mode
        if in_use and mode != self.mig_current:
            return NVML_ERROR_IN_USE
        self.mig_current = mode
        return NVML_SUCCESS

    def mig_devices(self) -> list[tuple[GpuInstance, ComputeInstance]]:
        """MIG devices (GI, CI pairs) in NVML index order: by GI id, then CI id."""
        return [
            (gi, gi.compute_instances[ci_id])
            for gi_id, gi in sorted(self.instances.items())
            for ci_id in sorted(gi.compute_instances)
        ]

    def layout(self) -> list[str]:
        """Profile names of the GIs that carry a full-size CI, sorted: what mig-parted asserts."""
        return sorted(gi.profile.name for gi in self.instances.values() if gi.full_ci() is not None)

    def apply_layout(self, plan: list[tuple[Profile, int]], *, uuid_seed: object = "") -> None:
        """Replace every GI with `plan` [(profile, start)], each with one full-size CI."""
        for gi in list(self.instances.values()):
            gi.compute_instances.clear()
            self.destroy_gpu_instance(gi.id)
        for profile, start in plan:
            gi = self.create_gpu_instance(profile, start, uuid_seed=uuid_seed)
            self.create_compute_instance(gi, profile.compute_slices)

    # --- metrics --------------------------------------------------------------------------

    def levels(self, t: float, work: dict[int | None, str]) -> tuple[float, dict[int, float], float]:
        """(GPU activity, {GI id: activity}, power W) at simulated time `t`, without changing state.

        `work` maps the units with a pod on them (GI ids, None for the whole GPU) to the workload's
        character. SM activity of a MIG GPU is the slice-weighted sum of its instances' activity.
        """
        instances: dict[int, float] = {}
        if self.mig_enabled:
            total = 0.0
            for gi in self.instances.values():
                instances[gi.id] = gi.load.activity(t, work.get(gi.id))
                total += instances[gi.id] * gi.profile.compute_slices / self.product.compute_slices
            activity = total
        else:
            activity = self.load.activity(t, work.get(None))
        limit = self.product.power_limit_w
        idle = idle_power_w(self.product)
        power = idle + (0.93 * limit - idle) * activity
        if self.thermal_throttle:
            power *= 0.7
        return activity, instances, power

    def update_metrics(self, t: float, work: dict[int | None, str], dt: float) -> None:
        """Advance the metric model to simulated time `t` (`work` as for levels())."""
        if self.lost:
            return
        self.activity, instances, self.power_w = self.levels(t, work)
        for gi_id, value in instances.items():
            self.instances[gi_id].activity = value
        self.energy_mj += self.power_w * dt * 1000.0
        self.temperature_c = self.temperature_at(self.activity)

    def temperature_at(self, activity: float) -> int:
        return int(round(29 + 46 * activity + (22 if self.thermal_throttle else 0)))

    @property
    def clocks_event_reasons(self) -> int:
        reasons = 0
        if self.activity < 0.05:
            reasons |= CLOCKS_EVENT_GPU_IDLE
        if self.thermal_throttle:
            reasons |= CLOCKS_EVENT_SW_THERMAL | CLOCKS_EVENT_HW_THERMAL
        return reasons


def plan_layout(product: Product, profiles: list[Profile]) -> list[tuple[Profile, int]] | None:
    """Find starts for `profiles` on an empty GPU, or None if they cannot all fit.

    A small backtracking search, largest profiles first (the guide's advice, §1.6), trying
    each profile's starts in the driver's default preference order. Memoised: a 2,000-node
    scenario asks the same question thousands of times.
    """
    plan = _plan_layout(product.key, tuple(sorted(p.name for p in profiles)))
    return None if plan is None else list(plan)


@functools.lru_cache(maxsize=1024)
def _plan_layout(product_key: str, names: tuple[str, ...]) -> tuple[tuple[Profile, int], ...] | None:
    product = PRODUCTS[product_key]
    profiles = [product.by_name[name] for name in names]
    if len(profiles) > product.max_gpu_instances:
        return None
    if sum(p.compute_slices for p in profiles) > product.compute_slices:
        return None
    for p in set(profiles):
        if profiles.count(p) > p.max_instances:
            return None
    order = _DEFAULT_ORDER_8 if product.memory_slices == 8 else _DEFAULT_ORDER_4
    ordered = sorted(profiles, key=lambda p: (-p.memory_slices, len(p.starts), p.name))
    placed: list[tuple[Profile, int]] = []

    def fits(start: int, size: int) -> bool:
        return all(start + size <= s or start >= s + q.memory_slices for q, s in placed)

    def search(i: int) -> bool:
        if i == len(ordered):
            return True
        p = ordered[i]
        starts = [s for s in order.get(p.memory_slices, ()) if s in p.starts]
        starts += [s for s in p.starts if s not in starts]
        for start in starts:
            if fits(start, p.memory_slices):
                placed.append((p, start))
                if search(i + 1):
                    return True
                placed.pop()
        return False

    return tuple(placed) if search(0) else None

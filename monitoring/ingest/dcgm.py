"""DCGM exporter series -> gpuaas readings (pure; the text is parsed by monitoring/adapters/prometheus.py).

Labels (reference §6): `UUID` is the *parent* GPU's UUID even on MIG lines (`uuid` with
--use-old-namespace); MIG lines add `GPU_I_PROFILE` and `GPU_I_ID`; the node is `Hostname`
(released versions) or `hostname` (main since 2026-05). There is no MIG UUID label: a MIG line
is matched to our MigInstance by (parent GPU, GI id).

Units: power W, energy mJ, framebuffer MiB, temperature C, GPU_UTIL percent, PROF_* ratios 0-1
(stored as percent). DCGM's "blank" sentinels (unsupported / not found) become None, never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..adapters.prometheus import PromSample

# Blank sentinels (dcgm_structs.h): int32 >= 0x7ffffff0, int64 >= 0x7ffffffffffffff0, fp64 >= 2**47.
_INT32_BLANK = 0x7FFFFFF0
_INT64_BLANK = float(0x7FFFFFFFFFFFFFF0)
_FP64_BLANK = 140737488355328.0

# field name -> (sample column, kind). kind: "float", "int", "ratio" (0-1 -> percent), "bool".
FIELDS: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", "float"),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_mj", "int"),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", "int"),
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util", "int"),
    "DCGM_FI_DEV_FB_USED": ("mem_used_mib", "int"),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", "ratio"),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_sbe_vol", "int"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_dbe_vol", "int"),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("ecc_sbe_agg", "int"),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc_dbe_agg", "int"),
    "DCGM_FI_DEV_XID_ERRORS": ("xid", "int"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remap_corr", "int"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remap_unc", "int"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("remap_failure", "bool"),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("throttle", "int"),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("throttle", "int"),
}
# Columns DCGM reports for the physical GPU even on a MIG instance's lines: the exporter repeats the GPU's
# value on every instance line (reference §6), so they belong to the GPU, once. Everything else in FIELDS
# (framebuffer, SM activity) is the instance's own.
PER_INSTANCE = frozenset({"mem_used_mib", "sm_active"})
DEVICE_COLUMNS = frozenset(column for column, _ in FIELDS.values()) - PER_INSTANCE | {"retired_pages"}
# Used for sm_active only when DCGM_FI_PROF_SM_ACTIVE is not exported (it is off by default).
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
RETIRED = ("DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE")
KNOWN = {*FIELDS, GR_ENGINE_ACTIVE, FB_FREE, FB_RESERVED, *RETIRED}


@dataclass(slots=True)
class DcgmUnit:
    """What one exporter said about one GPU (gi_id None) or one MIG instance (parent UUID + GI id)."""

    gpu_uuid: str
    gi_id: int | None
    hostname: str = ""
    gpu_index: int | None = None
    profile: str = ""
    values: dict[str, object] = field(default_factory=dict)
    mem_total_mib: int | None = None
    sm_from_gr_engine: bool = False
    # (namespace, pod) of the pods dcgm-exporter labels this unit with (it reads the kubelet's PodResources).
    pods: set[tuple[str, str]] = field(default_factory=set)

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.gpu_uuid, self.gi_id)


def _value(raw: float, kind: str) -> object | None:
    if raw != raw or (kind in ("float", "ratio") and raw >= _FP64_BLANK):  # NaN or fp64 blank
        return None
    if kind in ("int", "bool") and (_INT32_BLANK <= raw < 0x80000000 or raw >= _INT64_BLANK):
        return None
    if kind == "float":
        return raw
    if kind == "ratio":
        return max(0.0, min(100.0, raw * 100.0))
    if kind == "bool":
        return raw != 0
    return int(raw)


def readings(samples: list[PromSample]) -> list[DcgmUnit]:
    """Group the exporter's samples by unit; unknown metrics and lines without a GPU UUID are skipped."""
    units: dict[tuple[str, int | None], DcgmUnit] = {}
    extras: dict[tuple[str, int | None], dict[str, float]] = {}
    for sample in samples:
        labels = sample.labels
        uuid = labels.get("UUID") or labels.get("uuid") or ""
        if not uuid:
            continue
        gi_raw = labels.get("GPU_I_ID", "")
        gi_id = int(gi_raw) if gi_raw.isdigit() else None
        key = (uuid, gi_id)
        unit = units.get(key)
        if unit is None:
            index = labels.get("gpu", "")
            unit = units[key] = DcgmUnit(
                gpu_uuid=uuid,
                gi_id=gi_id,
                hostname=labels.get("Hostname") or labels.get("hostname") or "",
                gpu_index=int(index) if index.isdigit() else None,
                profile=labels.get("GPU_I_PROFILE", ""),
            )
        pod = labels.get("pod") or labels.get("pod_name") or ""  # pod_name/pod_namespace: --use-old-namespace
        namespace = labels.get("namespace") or labels.get("pod_namespace") or ""
        if pod and namespace:
            unit.pods.add((namespace, pod))
        name = sample.family if sample.family in KNOWN else sample.name
        mapped = FIELDS.get(name)
        if mapped is not None:
            column, kind = mapped
            value = _value(sample.value, kind)
            if column == "xid" and value is None:
                code = labels.get("err_code", "")
                value = int(code) if code.isdigit() else None
            if value is not None:
                unit.values[column] = value
        elif name in (GR_ENGINE_ACTIVE, FB_FREE, FB_RESERVED, *RETIRED):
            value = _value(sample.value, "ratio" if name == GR_ENGINE_ACTIVE else "int")
            if value is not None:
                extras.setdefault(key, {})[name] = value
    for key, unit in units.items():
        extra = extras.get(key, {})
        if "sm_active" not in unit.values and GR_ENGINE_ACTIVE in extra:
            unit.values["sm_active"] = extra[GR_ENGINE_ACTIVE]
            unit.sm_from_gr_engine = True
        used = unit.values.get("mem_used_mib")
        if used is not None and FB_FREE in extra:
            unit.mem_total_mib = int(used + extra[FB_FREE] + extra.get(FB_RESERVED, 0))
        if all(name in extra for name in RETIRED):
            unit.values["retired_pages"] = int(sum(extra[name] for name in RETIRED))
    _lift_device_fields(units)
    return list(units.values())


def _lift_device_fields(units: dict[tuple[str, int | None], DcgmUnit]) -> None:
    """Move device-level values off MIG instance lines onto their GPU, once.

    A MIG-enabled GPU has per-instance lines only, each repeating the GPU's power, energy, temperature,
    ECC and XID. Kept per instance they would be lost (instances store only their own columns) or counted
    once per instance (one XID raising an event per instance). The GPU's own line, when an exporter sends
    one, wins; otherwise the first instance line seen stands for the GPU (the repeats differ only by when
    each was sampled).
    """
    for (uuid, gi_id), unit in list(units.items()):
        if gi_id is None:
            continue
        device = {k: unit.values.pop(k) for k in list(unit.values) if k in DEVICE_COLUMNS}
        gpu = units.get((uuid, None))
        if gpu is None and not device:
            continue
        if gpu is None:
            gpu = units[(uuid, None)] = DcgmUnit(
                gpu_uuid=uuid, gi_id=None, hostname=unit.hostname, gpu_index=unit.gpu_index
            )
        for column, value in device.items():
            gpu.values.setdefault(column, value)

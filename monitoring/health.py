"""Health rules: which readings raise which events at which level (pure; no database).

rule              fires when                                                   level     clears when
ecc_dbe           volatile uncorrected (double-bit) ECC count > 0              critical  volatile count back to 0
xid_critical      an XID in MONITORING_XID_CRITICAL (48 63 64 74 79 92 94 95)  critical  no such XID for XID_CLEAR_S
xid_warning       an XID in MONITORING_XID_WARNING (13 31 43)                  warning   no such XID for XID_CLEAR_S
remap_pending     a row remap is pending (a GPU reset is needed)               warning   no longer pending
remap_failure     a row remap failed                                           critical  no longer reported
thermal_throttle  clocks-event reasons: SW or HW thermal slowdown              warning   absent for THROTTLE_CLEAR_S
power_throttle    clocks-event reasons: HW power-brake slowdown                warning   absent for THROTTLE_CLEAR_S
gpu_lost          NVML answers GPU_IS_LOST                                     critical  the GPU is readable again
(XID_CLEAR_S and THROTTLE_CLEAR_S are the MONITORING_* settings.)

A rule is only *evaluated* when its input is available: an unsupported counter (NULL) neither
raises nor clears an event. SW power capping (a GPU at its power limit) is normal under load and
is not a health problem; HW slowdown without a thermal or power-brake bit is not attributed.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from .choices import HealthLevel, HealthRule

# nvml.h nvmlClocksEventReason* bits (kept here so this module needs no NVML import).
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80

XID_MEANINGS = {
    13: "Graphics engine exception (usually the application)",
    31: "GPU memory page fault (usually the application)",
    43: "GPU stopped processing (application or driver)",
    48: "Double-bit ECC error",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
}

RULE_LEVELS: dict[str, str] = {
    HealthRule.ECC_DBE: HealthLevel.CRITICAL,
    HealthRule.XID_CRITICAL: HealthLevel.CRITICAL,
    HealthRule.XID_WARNING: HealthLevel.WARNING,
    HealthRule.REMAP_PENDING: HealthLevel.WARNING,
    HealthRule.REMAP_FAILURE: HealthLevel.CRITICAL,
    HealthRule.THERMAL_THROTTLE: HealthLevel.WARNING,
    HealthRule.POWER_THROTTLE: HealthLevel.WARNING,
    HealthRule.GPU_LOST: HealthLevel.CRITICAL,
}


def clear_after_s(rule: str) -> int:
    """How long a rule's condition must be absent before its open event resolves."""
    if rule in (HealthRule.XID_CRITICAL, HealthRule.XID_WARNING):
        return settings.MONITORING_XID_CLEAR_S
    if rule in (HealthRule.THERMAL_THROTTLE, HealthRule.POWER_THROTTLE):
        return settings.MONITORING_THROTTLE_CLEAR_S
    return 0


@dataclass(frozen=True, slots=True)
class Finding:
    rule: str
    value: int | None
    message: str

    @property
    def level(self) -> str:
        return RULE_LEVELS[self.rule]


@dataclass(slots=True)
class Reading:
    """The health-relevant part of one GPU (or MIG instance) reading; None = unavailable."""

    ecc_dbe_vol: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    throttle: int | None = None
    xids: list[int] | None = None
    lost: bool = False


def xid_rule(code: int) -> str | None:
    if code in settings.MONITORING_XID_CRITICAL:
        return HealthRule.XID_CRITICAL
    if code in settings.MONITORING_XID_WARNING:
        return HealthRule.XID_WARNING
    return None


def evaluate(reading: Reading) -> tuple[dict[str, Finding], set[str]]:
    """(findings by rule, rules evaluated). A rule evaluated without a finding may clear its event."""
    findings: dict[str, Finding] = {}
    evaluated: set[str] = {HealthRule.GPU_LOST}
    if reading.xids is not None:
        evaluated.update({HealthRule.XID_CRITICAL, HealthRule.XID_WARNING})
        for code in reading.xids:
            rule = xid_rule(code)
            if rule is not None and (rule not in findings or rule == HealthRule.XID_CRITICAL):
                meaning = XID_MEANINGS.get(code, "see NVIDIA's XID catalogue")
                findings[rule] = Finding(rule, code, f"XID {code}: {meaning}")
    if reading.lost:  # nothing else read from a lost GPU can be trusted
        findings[HealthRule.GPU_LOST] = Finding(HealthRule.GPU_LOST, None, "NVML: GPU is lost")
        return findings, evaluated

    if reading.ecc_dbe_vol is not None:
        evaluated.add(HealthRule.ECC_DBE)
        if reading.ecc_dbe_vol > 0:
            findings[HealthRule.ECC_DBE] = Finding(
                HealthRule.ECC_DBE, reading.ecc_dbe_vol, f"{reading.ecc_dbe_vol} uncorrected ECC error(s) since reset"
            )
    if reading.remap_pending is not None:
        evaluated.add(HealthRule.REMAP_PENDING)
        if reading.remap_pending:
            findings[HealthRule.REMAP_PENDING] = Finding(HealthRule.REMAP_PENDING, 1, "Row remap pending: reset")
    if reading.remap_failure is not None:
        evaluated.add(HealthRule.REMAP_FAILURE)
        if reading.remap_failure:
            findings[HealthRule.REMAP_FAILURE] = Finding(HealthRule.REMAP_FAILURE, 1, "Row remapping failed")
    if reading.throttle is not None:
        evaluated.update({HealthRule.THERMAL_THROTTLE, HealthRule.POWER_THROTTLE})
        if reading.throttle & (THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL):
            findings[HealthRule.THERMAL_THROTTLE] = Finding(
                HealthRule.THERMAL_THROTTLE, reading.throttle, f"Thermal slowdown (reasons 0x{reading.throttle:x})"
            )
        if reading.throttle & THROTTLE_HW_POWER_BRAKE:
            findings[HealthRule.POWER_THROTTLE] = Finding(
                HealthRule.POWER_THROTTLE, reading.throttle, f"Power-brake slowdown (reasons 0x{reading.throttle:x})"
            )
    return findings, evaluated

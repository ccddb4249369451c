"""NVIDIA XID error codes that matter most, and NVML clocks-event (throttle) reason bits.

From NVIDIA's XID catalogue (see shared/REFERENCE.md). ``DRAIN`` lists the XIDs that generally
mean the node must be drained.
"""

from __future__ import annotations

XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception",
    31: "memory page fault",
    43: "GPU stopped processing",
    48: "double-bit ECC error",
    61: "internal micro-controller halt",
    62: "internal micro-controller halt",
    63: "row-remap / page-retirement event",
    64: "row-remap failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP error",
    120: "GSP error",
}
DRAIN = frozenset({48, 64, 74, 79, 95, 119, 120})

# nvmlClocksEventReason* bits (older name: nvmlClocksThrottleReason*).
THROTTLE_REASONS: dict[int, str] = {
    0x1: "GPU idle",
    0x2: "applications clocks setting",
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x10: "sync boost",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake",
    0x100: "display clock setting",
}


def describe_xid(xid: int | None) -> str:
    if not xid:
        return "none"
    meaning = XID_MEANINGS.get(xid, "see NVIDIA's XID catalogue")
    return f"XID {xid}: {meaning}" + (" (drain the node)" if xid in DRAIN else "")


def describe_throttle(mask: int | None) -> str:
    if mask is None:
        return "–"
    reasons = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    return ", ".join(reasons) if reasons else "none"

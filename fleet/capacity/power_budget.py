"""What a power budget can run: GPU board power by model and whole nodes energised within a
budget. Pure arithmetic shared by the capacity plan (energised supply) and the power page
(GPUs installed but unpowered)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from django.conf import settings

# Board power (TDP, W) by model family, matched as a word in the GPU's model name (NVML's name,
# e.g. "NVIDIA H100 80GB HBM3"). SXM parts; a PCIe card draws less, so this errs on the safe side.
BOARD_POWER_W: dict[str, float] = {
    "B200": 1000.0,
    "H200": 700.0,
    "H100": 700.0,
    "A100": 400.0,
    "L40S": 350.0,
    "L40": 300.0,
    "L4": 72.0,
}
DEFAULT_BOARD_POWER_W = 700.0


def board_power_w(model: str) -> float:
    """The board power of a GPU model by its name (the largest known family for an unknown name)."""
    words = model.upper().replace("-", " ").split()
    for family, watts in BOARD_POWER_W.items():
        if family in words:
            return watts
    return DEFAULT_BOARD_POWER_W


def node_overhead_w() -> float:
    """Power a GPU node draws besides its GPUs (CPUs, memory, NICs, fans), from the settings."""
    return float(settings.NODE_OVERHEAD_W)


def node_power_w(gpus: int, board_w: float, overhead_w: float | None = None) -> float:
    """A node's power at full load: its GPUs at board power plus the node overhead."""
    return gpus * board_w + (node_overhead_w() if overhead_w is None else overhead_w)


def energisable_nodes(budget_w: float | None, node_w: float, nodes: int) -> int:
    """Whole nodes a budget runs at full load (all of them when no budget is stated)."""
    if budget_w is None:
        return nodes
    if node_w <= 0:
        return nodes
    return max(0, min(nodes, math.floor(budget_w / node_w + 1e-9)))


def energised_in_order(budget_w: float | None, node_watts: Sequence[float]) -> list[bool]:
    """Which of a rack's nodes (in hostname order, each at its full-load power) its budget runs:
    whole nodes while the budget lasts, a node that does not fit left dark and the next one tried.
    The rule of capacity's energised supply; every node without a budget."""
    if budget_w is None:
        return [True] * len(node_watts)
    left, out = budget_w, []
    for watts in node_watts:
        fits = energisable_nodes(left, watts, 1) == 1
        out.append(fits)
        if fits:
            left -= watts
    return out

"""What a power budget can run: GPU board power by model and whole nodes energised within a
budget. Pure arithmetic shared by the capacity plan (energised supply) and the power page
(GPUs installed but unpowered), and the site's power rule of the plan (site_power_steps)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date

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


# --- a site's contracted power over the plan --------------------------------------------------------


@dataclass(frozen=True)
class SiteNode:
    """An installed node its rack runs, as the site's power sees it: full-load watts and its GPUs
    by pool (a node of GPUs no pool counts has none)."""

    watts: float
    gpus: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Arrival:
    """GPUs landing on a pool (an order) on ``day``, each drawing ``gpu_w`` at full load."""

    day: date
    pool: int
    gpus: int
    gpu_w: float


@dataclass
class SitePower:
    """The site's power from ``day`` on: what it runs of each pool and what it leaves dark.

    ``power_w`` is the contracted power plus the approved kW landed (None: no contract, nothing is
    dark for the site's power); ``full_load_w`` what the site's installed nodes and landed GPUs
    draw at full load, ``used_w`` what the energised ones draw. Per pool: ``energised`` GPUs,
    ``dark_nodes`` / ``dark_gpus`` installed nodes and GPUs curtailed, ``waiting`` landed GPUs
    not yet energised."""

    day: date
    contract_w: float | None
    power_w: float | None
    full_load_w: float = 0.0
    used_w: float = 0.0
    energised: dict[int, int] = field(default_factory=dict)
    dark_nodes: dict[int, int] = field(default_factory=dict)
    dark_gpus: dict[int, int] = field(default_factory=dict)
    waiting: dict[int, int] = field(default_factory=dict)
    pools: tuple[int, ...] = ()  # the site's pools in power order
    nodes_on: tuple[bool, ...] = ()  # which of the nodes (in the order given) run

    def curtailed(self, pool: int) -> int:
        """The pool's GPUs (installed or landed) the site's power leaves dark."""
        return self.dark_gpus.get(pool, 0) + self.waiting.get(pool, 0)

    def why(self, pool: int) -> str | None:
        """Why the pool has GPUs dark for the site's power, in figures (None when it has none)."""
        if not self.curtailed(pool) or self.power_w is None or self.contract_w is None:
            return None
        parts = []
        if self.dark_gpus.get(pool):
            gpus, nodes = self.dark_gpus[pool], self.dark_nodes[pool]
            parts.append(f"{_count(gpus, 'installed GPU')} curtailed ({_count(nodes, 'node')})")
        if self.waiting.get(pool):
            parts.append(f"{_count(self.waiting[pool], 'landed GPU')} not energised")
        place = f"pool {self.pools.index(pool) + 1} of {len(self.pools)}" if pool in self.pools else "no pool"
        approved = self.power_w - self.contract_w
        return (
            f"{', '.join(parts)}: site power {self.power_w / 1000:.1f} kW ({self.contract_w / 1000:.1f} contracted"
            f" + {approved / 1000:.1f} approved) runs {self.used_w / 1000:.1f} of {self.full_load_w / 1000:.1f} kW"
            f" at full load; {place} in the site's power order"
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _tally(out: SitePower, nodes: Sequence[SiteNode], landed: Sequence[Arrival], lit: Sequence[int]) -> None:
    """Fill ``out`` from the nodes running or dark (``out.nodes_on``) and the landed arrivals with the
    GPUs of each energised (``lit``): full-load and used watts, and per pool what runs and what not."""
    energised: dict[int, int] = defaultdict(int)
    for node, running in zip(nodes, out.nodes_on, strict=True):
        out.full_load_w += node.watts
        out.used_w += node.watts if running else 0.0
        for pool, gpus in node.gpus.items():
            if running:
                energised[pool] += gpus
            else:
                out.dark_nodes[pool] = out.dark_nodes.get(pool, 0) + 1
                out.dark_gpus[pool] = out.dark_gpus.get(pool, 0) + gpus
    for arrival, n in zip(landed, lit, strict=False):
        out.full_load_w += arrival.gpus * arrival.gpu_w
        out.used_w += n * arrival.gpu_w
        energised[arrival.pool] += n
        if n < arrival.gpus:
            out.waiting[arrival.pool] = out.waiting.get(arrival.pool, 0) + arrival.gpus - n
    out.energised = dict(energised)


def site_power_steps(
    *,
    contract_w: float | None,
    today: date,
    nodes: Sequence[SiteNode],
    arrivals: Iterable[Arrival] = (),
    approvals: Iterable[tuple[date, float]] = (),
    pools: Sequence[int] = (),
) -> list[SitePower]:
    """The site's power rule: its state today, then at each later date power lands or GPUs arrive.

    ``nodes`` come in the site's power order (the caller's: pools in order, nodes in hostname
    order within a pool), ``approvals`` are (expected date, W) of the approved power. An approval
    due by today counts today; an arrival dated before today lands today.

    1. Today the contracted power plus the approvals due runs the nodes in order, whole nodes at
       full load: a node that does not fit what is left is curtailed and the next one tried.
    2. At each later date, in this order: approved power lands and first restores curtailed nodes
       (same order, whole nodes); then GPUs landing that day join the queue, and the power left
       energises the queue in arrival order (a date's arrivals in the given order), GPU by GPU at
       their pool's per-GPU power (their nodes are not in the inventory yet).
    3. Power only grows over the plan, so nothing energised is ever switched off.

    A site with no contracted power runs every node and every landed GPU.
    """
    approvals = list(approvals)
    queue = sorted(arrivals, key=lambda a: max(a.day, today))  # stable: a date's in the given order
    power = None if contract_w is None else contract_w + sum(w for d, w in approvals if d <= today)
    on = [power is None] * len(nodes)
    left = 0.0 if power is None else power
    lit = [0] * len(queue)  # GPUs of each arrival energised

    def fill_nodes() -> None:
        nonlocal left
        for i, node in enumerate(nodes):
            if not on[i] and energisable_nodes(left, node.watts, 1) == 1:
                on[i] = True
                left -= node.watts

    def state(day: date, landed: int) -> SitePower:
        out = SitePower(day=day, contract_w=contract_w, power_w=power, pools=tuple(pools), nodes_on=tuple(on))
        _tally(out, nodes, queue[:landed], lit)
        return out

    if power is not None:
        fill_nodes()
    states = [state(today, 0)]
    days = sorted({d for d, _ in approvals if d > today} | {max(a.day, today) for a in queue})
    landed = 0
    for day in days:
        if power is not None:
            added = sum(w for d, w in approvals if d == day and d > today)
            power += added
            left += added
            fill_nodes()  # approved power restores curtailed nodes first
        while landed < len(queue) and max(queue[landed].day, today) <= day:
            landed += 1
        for i in range(landed):  # then the arrivals still dark, in arrival order
            arrival = queue[i]
            if power is None or arrival.gpu_w <= 0:
                lit[i] = arrival.gpus
            elif lit[i] < arrival.gpus:
                n = min(arrival.gpus - lit[i], max(0, math.floor(left / arrival.gpu_w + 1e-9)))
                lit[i] += n
                left -= n * arrival.gpu_w
        states.append(state(day, landed))
    return states

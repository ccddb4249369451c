"""Which jobs run on which nodes, for rooms that may not import training (fabric, storage): the
training room registers a locator here at start-up (fleet.training.detectors), as it registers its
GPU-fault hook; a room above telemetry asks ``jobs_on_hosts``. Without a locator (training not
loaded) no job is on any node."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class PlacedJob:
    """A job holding GPUs on a node now: what a finding about the node's ports or mounts names."""

    pk: int
    name: str
    team: str
    gang: int


Locator = Callable[[datetime, Iterable[str]], dict[str, list[PlacedJob]]]
_locator: list[Locator] = []


def register_job_locator(locator: Locator) -> None:
    """(now, hostnames) -> hostname -> the jobs holding GPUs on it now. The last one registered wins."""
    _locator[:] = [locator]


def jobs_on_hosts(now: datetime, hostnames: Iterable[str]) -> dict[str, list[PlacedJob]]:
    hosts = sorted(set(hostnames) - {""})
    if not _locator or not hosts:
        return {}
    return _locator[0](now, hosts)

"""Velero's backup metrics pushed to the Prometheus door: compliance's entry in the exporter
mapping table (fleet.exporters), registered from compliance/plugins.py. They are mapped from the
push's text as a whole (a few series a backup schedule: compliance.services.velero.map_scrape),
into backup reports of the recovery register; the door's parse counts them as ignored."""

from __future__ import annotations

from compliance.services import velero
from fleet.exporters import PUSH, ExporterMapping

MAPPINGS = (ExporterMapping("velero", PUSH, velero.map_scrape, prefix=velero.PREFIX),)

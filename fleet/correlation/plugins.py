"""What correlation plugs in, joining sibling rooms that may not import each other: the gang hosts
fabric's detectors ask for, fabric and storage causes on training's findings, the storage page's
fabric bytes, and the episodes section and snapshot part of the job page."""

from fleet.correlation import causes, episodes
from fleet.correlation.serializers import JobEpisodeSerializer
from fleet.fabric import detectors as fabric_detectors
from fleet.fabric.read import health as fabric
from fleet.storage import read as storage
from fleet.training import detectors as training_detectors
from fleet.training.api import register_job_snapshot_part
from fleet.training.views import register_job_section

fabric_detectors.register_gang_lookup(causes.gang_hosts)
training_detectors.register_job_finding_hook(causes.fabric_causes)
training_detectors.register_job_finding_hook(causes.storage_causes)
storage.register_fabric_reads(fabric.storage_reads)
register_job_section("correlation/_job_episodes.html", episodes.job_section, order=10)
register_job_snapshot_part("episodes", episodes.job_episodes, described_by=JobEpisodeSerializer(many=True))

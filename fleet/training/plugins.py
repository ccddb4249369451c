"""What training plugs in: its detectors, the job on GPU-fault findings, the jobs on a host for the
rooms that may not import training, the training and job live topics, and the overview tile."""

from console import live, overview
from fleet.telemetry import detectors as gpu_health
from fleet.telemetry import placement
from fleet.training import detectors, read
from incidents.detectors import register_detectors

register_detectors(detectors)
# GPU faults (fleet.telemetry.detectors) on a job's GPUs or nodes carry the job and its cost.
gpu_health.register_gpu_fault_hook(detectors.link_to_jobs)
# Fabric and storage findings name the jobs on their nodes through this locator.
placement.register_job_locator(detectors.placed_jobs)
live.register_topic_builder("training", read.build_training_delta)
live.register_topic_builder("job", read.build_job_delta)
overview.register_section(
    overview.Section(name="training", template="training/_overview.html", context=read.overview_tile, order=20)
)

"""What ingest plugs in: the Prometheus pushes' lane, each lane's stream on /readyz, and the queue's
oldest wait for the ingest-silent detector."""

from console import queues
from fleet.ingest import push_queue, stream
from fleet.telemetry import silent_sources

stream.register_lane(push_queue.PROMETHEUS)
for lane in stream.LANES:
    queues.register_stream(lane.stream)
silent_sources.register_backlog_probe(lambda: stream.oldest_waiting_seconds())

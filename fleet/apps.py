from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Fleet"

    def ready(self) -> None:
        from console import live, metrics, overview, queues
        from fleet import metrics as fleet_metrics
        from fleet.capacity.read import tables as capacity_tables
        from fleet.correlation import causes  # noqa: F401  (registers the fabric detectors' lookups and cause hooks)
        from fleet.correlation import episodes as correlation_episodes
        from fleet.fabric.read import health as fabric
        from fleet.ingest import stream as ingest_stream
        from fleet.power import detectors as power_detectors  # noqa: F401  (registers its detectors)
        from fleet.power import read as power
        from fleet.scheduler import detectors as scheduler_detectors  # noqa: F401  (registers its detectors)
        from fleet.scheduler import read as scheduler_read
        from fleet.scheduler import views as scheduler_views
        from fleet.serving import detectors as serving_detectors  # noqa: F401  (registers its detectors)
        from fleet.serving import read as serving_read
        from fleet.storage import detectors as storage_detectors  # noqa: F401  (registers its detectors)
        from fleet.storage import read as storage
        from fleet.telemetry import detectors as gpu_health_detectors  # noqa: F401  (registers its detectors)
        from fleet.telemetry import silent_sources
        from fleet.telemetry.read import figures, fleet_summary
        from fleet.training import detectors as training_detectors  # noqa: F401  (registers its detectors and hook)
        from fleet.training import read as training_read

        metrics.register_collector(fleet_metrics.collect)
        from fleet.ingest import push_queue  # noqa: F401  (registers the Prometheus pushes' lane)

        for lane in ingest_stream.LANES:
            queues.register_stream(lane.stream)
        silent_sources.register_backlog_probe(lambda: ingest_stream.oldest_waiting_seconds())
        fleet_summary.register()  # the fleet, site.<id> and fleetview.<digest> topics
        live.register_topic_builder("gpu", figures.build_gpu_delta)
        live.register_topic_builder("node", figures.build_node_delta)
        live.register_topic_watcher("gpu", live.watch_topic)
        live.register_topic_watcher("node", live.watch_topic)
        training_read.register()
        serving_read.register()
        power.register()
        fabric.register()
        storage.register()
        # Storage does not import fabric (siblings): the join is wired here.
        storage.register_fabric_reads(fabric.storage_reads)
        # Training imports neither: the job page's hangs and stalls with its nodes' ports and
        # mounts come from the room above all three.
        correlation_episodes.register()
        capacity_tables.register()
        scheduler_views.register()
        # Capacity does not import the scheduler (it sits above): its queue panel, API part and
        # live topic are handed to capacity's hooks here.
        scheduler_read.register()
        # Cost prices the rooms below it: its page, tile, live topic and the money on the job,
        # incident and capacity pages.
        from fleet.cost import read as cost

        cost.register()
        overview.register_section(
            overview.Section(
                name="fleet",
                template="fleet/_overview.html",
                context=lambda request: {"totals": figures.fleet_totals(), "sites": figures.site_summaries()},
                order=10,
            )
        )

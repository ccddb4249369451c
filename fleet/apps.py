from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Fleet"

    def ready(self) -> None:
        from console import live, metrics, overview, queues
        from fleet import detectors, power_detectors, serving_detectors, silence, training_detectors  # noqa: F401  (register the detectors)
        from fleet import metrics as fleet_metrics
        from fleet.services import (
            capacity_pages,
            dashboard,
            ingest_stream,
            power,
            serving_dashboard,
            training_dashboard,
        )

        metrics.register_collector(fleet_metrics.collect)
        queues.register_stream(ingest_stream.STREAM)
        live.register_topic_builder("fleet", dashboard.build_fleet_delta)
        live.register_topic_builder("gpu", dashboard.build_gpu_delta)
        live.register_topic_builder("node", dashboard.build_node_delta)
        live.register_topic_watcher("gpu", dashboard.watch_topic)
        live.register_topic_watcher("node", dashboard.watch_topic)
        training_dashboard.register()
        serving_dashboard.register()
        power.register()
        capacity_pages.register()
        overview.register_section(
            overview.Section(
                name="fleet",
                template="fleet/_overview.html",
                context=lambda request: {"totals": dashboard.fleet_totals(), "sites": dashboard.site_summaries()},
                order=10,
            )
        )

from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Fleet"

    def ready(self) -> None:
        from console import live, metrics, overview, queues
        from fleet import detectors  # noqa: F401  (registers the GPU-health detectors)
        from fleet import metrics as fleet_metrics
        from fleet.services import dashboard, ingest_stream

        metrics.register_collector(fleet_metrics.collect)
        queues.register_stream(ingest_stream.STREAM)
        live.register_topic_builder("fleet", dashboard.build_fleet_delta)
        overview.register_section(
            overview.Section(
                name="fleet",
                template="fleet/_overview.html",
                context=lambda request: {"totals": dashboard.fleet_totals(), "sites": dashboard.site_summaries()},
                order=10,
            )
        )

"""What incidents plugs in: the ``incidents`` live topic and the overview tile."""

from console import live, overview
from incidents.services import views_data

live.register_topic_builder("incidents", views_data.build_incidents_delta)
overview.register_section(
    overview.Section(
        name="incidents",
        template="incidents/_overview.html",
        context=lambda request: views_data.overview_context(),
        order=5,
    )
)

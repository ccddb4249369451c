"""What compliance plugs in: the recovery detectors, the compliance and recovery tiles on the
overview, and Velero's backup metrics pushed to the Prometheus door (they become backup reports)."""

from compliance import detectors, mappings, overview
from compliance.permissions import COMPLIANCE_PERMISSION, RECOVERY_VIEW
from console.overview import Section, register_section
from fleet.exporters import register_mappings
from incidents.detectors import register_detectors

register_detectors(detectors)
register_section(
    Section(
        name="compliance",
        template="compliance/_overview.html",
        context=overview.overview_tile,
        order=60,
        permission=COMPLIANCE_PERMISSION,
    )
)
register_section(
    Section(
        name="recovery",
        template="recovery/_overview.html",
        context=overview.recovery_tile,
        order=65,
        permission=RECOVERY_VIEW,
    )
)
register_mappings(*mappings.MAPPINGS)

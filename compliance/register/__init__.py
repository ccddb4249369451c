"""The register: model versions and datasets, and the lineage between them.

The area's pages, forms and API sit here under the names every fleet room uses; its models stay in
``compliance.models.register`` and its commands and reads in ``compliance.services``."""

"""EU AI Act public training-content summaries: a model's live draft, its published versions and their PDFs.

The area's pages, forms and API sit here under the names every fleet room uses; its models stay in
``compliance.models.summary`` and its commands and reads in ``compliance.services``."""

"""GDPR records of processing (Art. 30), processor records and data-subject requests.

The area's pages, forms and API sit here under the names every fleet room uses; its models stay in
``compliance.models.gdpr`` and its commands and reads in ``compliance.services``."""

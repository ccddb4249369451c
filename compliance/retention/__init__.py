"""Retention policies, their runs and legal holds.

The area's pages, forms and API sit here under the names every fleet room uses; its models stay in
``compliance.models.retention`` and its commands and reads in ``compliance.services``."""

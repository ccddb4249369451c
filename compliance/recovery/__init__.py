"""The recovery register: what must be restorable, its backups and restore tests (Velero's reports included).

The area's pages, forms and API sit here under the names every fleet room uses; its models stay in
``compliance.models.recovery`` and its commands and reads in ``compliance.services``."""

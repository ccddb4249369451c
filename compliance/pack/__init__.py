"""The compliance pack: one zip of every record for a period, built in the background.

The area's pages, forms and API sit here under the names every fleet room uses; its models stay in
``compliance.models.pack`` and its commands and reads in ``compliance.services``."""

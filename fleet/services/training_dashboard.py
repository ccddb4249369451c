"""The training pages' data and live pushes: filled in by the training pages work."""


def register() -> None:
    """Register the training live topics and the overview tile."""

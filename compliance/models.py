"""Compliance models arrive with the compliance issue; the app exists so the layout and imports are fixed."""

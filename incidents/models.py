"""Incident models arrive with the incidents issue; the app exists so the layout and imports are fixed."""

"""What the fabric page and its API read: port health over a window (health) from the figures the
port rollups keep ahead of it (summaries)."""

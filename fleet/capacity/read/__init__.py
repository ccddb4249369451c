"""What the capacity pages, the plan API and the overview tile read."""

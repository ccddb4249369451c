"""Cost: prices and their arithmetic (fleet.cost)."""

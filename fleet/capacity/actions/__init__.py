"""What people and the API do to capacity: request, change, approve and cancel reservations, the
beat's state changes (reservations), and the separation of duties over approvals of reservations,
orders and power (approvals)."""

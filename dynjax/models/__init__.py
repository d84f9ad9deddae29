"""Model families. Each module declares its coefficient schema (see dynjax.coeffs)."""

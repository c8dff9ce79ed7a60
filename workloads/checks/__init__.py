"""GPU readiness checks run on every worker node before training."""

"""What happens next to a step, decided from a snapshot of the ledger and the backend (pure, no IO)."""

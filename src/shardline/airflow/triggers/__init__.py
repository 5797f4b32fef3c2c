"""Triggers: all polling of a step (its job and ledger, its backoff, its input) happens here."""

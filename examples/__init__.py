"""Examples that live beside the package, not in it: the demos and the synthetic data and models."""

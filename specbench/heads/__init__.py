"""Trained self-drafting heads: EAGLE-1 and Medusa-1 modules, checkpoints, static trees, training."""

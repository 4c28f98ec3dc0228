"""The trainer: configuration, the two-stage recipe, callbacks and checkpoints."""

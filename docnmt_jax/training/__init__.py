"""Losses, optimiser, train state, checkpoints and the training loop shared by every model."""

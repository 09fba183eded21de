"""The training loop (`train`: from a config to a trained, checkpointed and evaluated model, top
to bottom) and the full check of a config before it starts (`setup`), above the pieces they call
(`training/`, `evaluators/`)."""

"""Training: the loop, its steps and optimizer, the work directory, resuming, distillation."""

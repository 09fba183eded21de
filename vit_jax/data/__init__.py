"""Data: datasets by name, input pipelines, augmentations."""

"""Datasets that vit_jax provides itself; everything else comes from TFDS by name."""

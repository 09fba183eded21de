"""Vision Transformers and their attention variants in JAX/Flax."""

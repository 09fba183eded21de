"""The settings of a run, each type a frozen dataclass that declares the config fields it reads
(`setting`): `run.Settings` is the root, holding `data`, `optim`, `step` and `mesh`'s types. The
config's schema (`vit_jax.schema.config.FIELDS`), defaults, checks and listing derive from them. Free of
JAX and TensorFlow: reading a config file imports this package."""

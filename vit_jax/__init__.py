"""Vision Transformers and their attention variants in JAX/Flax.

The packages of vit_jax are its layers, bottom to top (`LAYERS`): a module imports modules of its
own layer and of those below it, never above (`tests/test_layers.py` checks it, imports inside
functions included). The commands are the modules at the top of vit_jax/, above every layer.
"""

LAYERS: tuple[tuple[str, ...], ...] = (
    ('process',),  # How a command's process starts and ends, and the modules of yours it imports.
    ('schema',),  # The settings, the config's fields, rules and checks, and the names they take.
    ('data', 'models', 'parallel', 'workdir'),  # The library.
    ('weights',),  # Weights from elsewhere, and runs loaded to run frozen.
    ('configs',),
    ('training',),  # The pieces the loop calls.
    ('evaluators',),
    ('loop',),  # The training loop and its set-up check.
    ('analysis', 'benchmarks'),  # What runs the loop.
)

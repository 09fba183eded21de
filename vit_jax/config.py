"""Lists every config field with its default, rule and meaning, and the sections:
`python -m vit_jax.config`."""

from vit_jax.process import exits
from vit_jax.schema import config as config_lib

if __name__ == '__main__':
  with exits.closed_output_ends_quietly():
    print(config_lib.describe(), flush=True)

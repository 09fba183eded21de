"""The device mesh of a run: (data x fsdp) over every device (`vit_jax.parallel.sharding`)."""

import dataclasses

from vit_jax.schema import rules as config_rules
from vit_jax.schema.setting import setting


@dataclasses.dataclass(frozen=True)
class MeshSettings:
  """The mesh of a run: `fsdp` devices split the state; arrays under `fsdp_min_size` elements
  stay replicated."""

  fsdp: int = setting(
      1,
      config_rules.integer(1),
      'Devices that split parameters, gradients, optimizer state and EMA; 1 = replicated. '
      'Must divide the number of devices.',
      flag='mesh.fsdp',
  )
  fsdp_min_size: int = setting(
      2**18,
      config_rules.integer(0),
      'Arrays with fewer elements (1 MiB in float32) stay replicated.',
      flag='mesh.fsdp_min_size',
  )

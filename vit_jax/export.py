r"""Exports a work directory's newest checkpoint as a timm `.safetensors` file, for PyTorch.

The run's EMA weights where it kept an EMA (`--nouse_ema`: the raw ones).

  python -m vit_jax.export --workdir=/tmp/deit --out=/tmp/deit.safetensors

In PyTorch: `model = timm.create_model(NAME, num_classes=..., img_size=...)` with the architecture
of the run, then `model.load_state_dict(safetensors.torch.load_file('/tmp/deit.safetensors'))`.
The file's metadata names the run's model, its fields, classes and evaluation preprocessing
(`pretrained.Exported`), so that `vit_jax.predict --init_from=FILE` needs no --model.
"""

import os

from absl import flags

from vit_jax.process import extensions
from vit_jax.process import runtime

_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Work directory written by vit_jax.main.', required=True
)
_OUT = flags.DEFINE_string('out', None, 'The .safetensors file to write.', required=True)
_USE_EMA = flags.DEFINE_bool(
    'use_ema',
    True,
    "Export the run's EMA weights where it kept an EMA; " '--nouse_ema exports the raw ones.',
)
extensions.define_allow_imports_flag()  # Reading a run imports its modules only with it.
flags.adopt_module_key_flags(extensions)


def main(argv) -> None:
  del argv
  # pylint: disable=g-import-not-at-top
  from vit_jax import models
  from vit_jax.weights import pretrained
  from vit_jax.workdir import disk_writes
  from vit_jax.workdir import reader
  # pylint: enable=g-import-not-at-top
  # Readers go by the suffix (a .pth is a pickle), in any case.
  if not _OUT.value.lower().endswith('.safetensors'):
    raise ValueError(
        f'--out={_OUT.value!r}: the export is a safetensors file; name it '
        f'{os.path.splitext(_OUT.value)[0]}.safetensors.'
    )
  disk_writes.check_writable(_OUT.value, pretrained.EXPORT_ROOM, directory=False)
  run = reader.Workdir.open(_WORKDIR.value)  # No dataset needed: the family names the layout.
  config = run.required_config()
  name = config.model.name
  yours = extensions.model_parts_of_yours(config)
  if yours:
    raise ValueError(
        f'{_WORKDIR.value} uses parts of your own modules ({"; ".join(yours)}), which timm '
        "has no layout for: export writes timm's; read the run's weights with vit_jax "
        '(vit_jax.workdir.reader.Workdir.read_variables) instead.'
    )
  saved = run.read_variables(use_ema=_USE_EMA.value, unrolled=True)
  described = pretrained.describe_run(run, saved.variables)
  keys = pretrained.export_timm(
      saved.variables, models.create(name), _OUT.value, described=described
  )
  print(
      f'Wrote {len(keys)} tensors of {name} (step {saved.step}, '
      f'{"ema" if saved.ema else "raw"} weights) to {_OUT.value}; its metadata names the model, '
      f'its fields {described.model_fields}, {described.num_classes} classes and '
      f'{described.image_size} px input: vit_jax.predict --init_from={_OUT.value} needs no '
      '--model.'
  )


if __name__ == '__main__':
  runtime.run(main)

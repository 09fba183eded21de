"""The run's steps as TPUs and GPUs would compile them, checked from any machine.

`jax.export` lowers the run's own jitted steps (`step_programs`), with abstract sharded arguments
over an `AbstractMesh`, for platforms and devices this machine lacks (`export_steps`);
`matrix_products` reads the dtypes a lowered program's products multiply. `attention_implementation=
'cudnn'` cannot be cross-lowered (`jax.nn.dot_product_attention` asks the local cuDNN while
tracing); it is checked on CPU by refusing clearly, and its XLA twin by equality with the default.
"""

import dataclasses
import re
import traceback
from typing import Any, Sequence

import jax
from jax.sharding import AbstractMesh, AxisType
import jax.numpy as jnp
import ml_collections

from vit_jax import models
from vit_jax.evaluators import passes
from vit_jax.training import memory as training_memory
from vit_jax.training import optim
from vit_jax.parallel import sharding
from vit_jax.training import steps
from vit_jax.loop import train
from vit_jax.schema import setting
from vit_jax.schema import run as run_settings
from vit_jax.training import start as start_lib

PLATFORMS = ('tpu', 'cuda')

_PRODUCT = re.compile(
    r'stablehlo\.(dot_general|convolution)\b.*:\s*\(([^)]*)\)\s*->\s*'
    r'tensor<[^>]*>(?:\s*loc\((#loc\d+)\))?'
)
_LOCATION = re.compile(r'^(#loc\d+) = loc\((?:"([^"]*)"|(#loc\d+)|callsite\((#loc\d+))')
_ELEMENT = re.compile(r'x?([a-z]+\d*)>$')


@dataclasses.dataclass(frozen=True)
class MatrixProduct:
  """A dot_general or convolution of a lowered program: its operands' element types (`f32`,
  `bf16`, ...), whether its algorithm rounds both operands to bfloat16 first, and the name stack
  of the code that made it (e.g. 'transpose(jvp(CaiT))/.../attn/proj_w/dot_general')."""

  op: str
  operand_types: tuple[str, ...]
  bfloat16_algorithm: bool
  name: str

  @property
  def float32_operand(self) -> bool:
    """Whether an operand is float32 (on GPU and TPU, a float32 product unless its algorithm
    rounds the operands first)."""
    return 'f32' in self.operand_types


def _location_names(text: str) -> dict[str, str]:
  """`#locN` -> the name stack it (or the location it refers to) carries."""
  direct, refers = {}, {}
  for line in text.splitlines():
    match = _LOCATION.match(line)
    if match:
      alias, name, ref, call = match.groups()
      if name is not None:
        direct[alias] = name
      else:
        refers[alias] = ref or call

  def resolve(alias: str, depth: int = 0) -> str:
    if alias in direct or depth > 50:
      return direct.get(alias, '')
    return resolve(refers[alias], depth + 1) if alias in refers else ''

  return {alias: resolve(alias) for alias in {**direct, **refers}}


def _element_type(tensor_type: str) -> str:
  """The element type of a StableHLO tensor type ('tensor<8x16xbf16>': 'bf16'), else the type."""
  found = _ELEMENT.search(tensor_type.strip())
  return found.group(1) if found else tensor_type.strip()


def matrix_products(text: str) -> list[MatrixProduct]:
  """The dot_general and convolution ops of a StableHLO module (`as_text(debug_info=True)` for
  their names)."""
  names = _location_names(text)
  products = []
  for line in text.splitlines():
    match = _PRODUCT.search(line)
    if not match:
      continue
    op, operands, location = match.groups()
    types = tuple(_element_type(t) for t in operands.split(', tensor'))
    products.append(
        MatrixProduct(
            op=op,
            operand_types=types,
            bfloat16_algorithm='lhs_precision_type = bf16, rhs_precision_type = bf16' in line,
            name=names.get(location, '') if location else '',
        )
    )
  return products


def abstract_mesh(fsdp: int, devices: int = 8) -> AbstractMesh:
  """The (data, fsdp) mesh of `sharding.make_mesh` over `devices` devices that need not exist."""
  sharding.check_mesh(fsdp, devices)
  return AbstractMesh(
      (devices // fsdp, fsdp),
      sharding.MESH_AXES,
      axis_types=(AxisType.Auto,) * len(sharding.MESH_AXES),
  )


@dataclasses.dataclass(frozen=True)
class StepProgram:
  """A jitted step and abstract (shape, dtype, sharding) arguments to lower it with."""

  name: str
  function: jax.stages.Wrapped
  arguments: tuple[Any, ...]


def _eval_batch(mesh: Any, size: int, image_size: int) -> dict[str, Any]:
  layout = sharding.batch_sharding(mesh)
  return {
      'image': jax.ShapeDtypeStruct(
          (size, image_size, image_size, 3), jnp.float32, sharding=layout
      ),
      'label': jax.ShapeDtypeStruct((size,), jnp.int32, sharding=layout),
      'mask': jax.ShapeDtypeStruct((size,), jnp.float32, sharding=layout),
  }


def step_programs(
    config: ml_collections.ConfigDict,
    num_classes: int,
    mesh: Any,
    *,
    batch_size: int,
    teacher_model: str | None = None,
) -> list[StepProgram]:
  """The train and eval steps of a run of `config` on `mesh`, as `vit_jax.loop.train` jits them,
  distilling from the registered `teacher_model` if given."""
  if config.augment_on_device is None:  # As a run on an accelerator resolves it.
    config = config.copy_and_resolve_references()
    config.augment_on_device = True
  settings = setting.build(run_settings.Settings, config)
  schedule = optim.learning_rate_schedule(settings.schedule, max(config.total_steps, 2), 1)
  start = start_lib.for_run(settings, num_classes, schedule)
  model, tx = start.model, start.tx
  abstract_state = jax.eval_shape(start.init)
  teacher = teacher_variables = None
  if teacher_model is not None:
    teacher_net = models.create(
        teacher_model, num_classes=num_classes, dtype=jnp.dtype(config.dtype)
    )
    images = jnp.zeros((1, config.image_size, config.image_size, 3), jnp.float32)
    variables = jax.eval_shape(lambda: teacher_net.init(jax.random.key(0), images, train=False))
    teacher = steps.Teacher(teacher_net, variables)
  programs = train.Programs.build(
      model,
      tx,
      settings.step,
      num_classes,
      mesh,
      abstract_state,
      settings.mesh.fsdp_min_size,
      teacher,
  )
  if teacher is not None:
    teacher_variables = sharding.abstract(teacher.variables, programs.teacher_sharding)
  state = sharding.abstract(abstract_state, programs.state_sharding)
  train_batch = training_memory.train_batch(
      settings.data, sharding.batch_sharding(mesh), batch_size
  )
  return [
      StepProgram('train', programs.train_step, (state, train_batch, teacher_variables, schedule)),
      StepProgram(
          'eval',
          passes.jitted_eval_step(model, num_classes, mesh),
          (state, _eval_batch(mesh, batch_size, config.image_size)),
      ),
  ]


class LoweringError(RuntimeError):
  """A step that does not lower for a platform; the message names the case, step and op."""


def _innermost_project_frame(error: BaseException) -> str:
  frames = [f for f in traceback.extract_tb(error.__traceback__) if '/vit_jax/' in f.filename]
  if not frames:
    return 'outside vit_jax'
  frame = frames[-1]
  return f'{frame.filename.rsplit("/vit_jax/", 1)[1]}:{frame.lineno} `{frame.line}`'


def _lowering_error(
    case: str, what: str, platforms: Sequence[str], error: Exception
) -> LoweringError:
  message = str(error).splitlines()[0] if str(error) else ''
  return LoweringError(
      f'{case}: {what} does not lower for {list(platforms)}: '
      f'{type(error).__name__}: {message} (at {_innermost_project_frame(error)})'
  )


def export_steps(
    config: ml_collections.ConfigDict,
    num_classes: int,
    mesh: Any,
    *,
    batch_size: int,
    case: str,
    teacher_model: str | None = None,
    platforms: Sequence[str] = PLATFORMS,
) -> dict[str, jax.export.Exported]:
  """`step_programs`' steps exported for `platforms` (one lowering for all), by name; LoweringError
  naming `case`, the step (or the set-up) and the failing op's source line in vit_jax."""
  try:
    programs = step_programs(
        config, num_classes, mesh, batch_size=batch_size, teacher_model=teacher_model
    )
  except Exception as e:  # pylint: disable=broad-except
    raise _lowering_error(case, 'the set-up of the steps', platforms, e) from e
  exported = {}
  for program in programs:
    try:
      exported[program.name] = jax.export.export(program.function, platforms=platforms)(
          *program.arguments
      )
    except Exception as e:  # pylint: disable=broad-except
      raise _lowering_error(case, f'the {program.name} step', platforms, e) from e
  return exported

"""The run's steps on the target hardware, checked without it.

The cross-lowering matrix: for every family (its config's quick model, `configs.family_configs`)
and every recipe feature that changes the step, the project's jitted train and eval steps export
for TPU and CUDA, in float32 and bfloat16, over an 8-device mesh (fsdp=8, and data parallel).
Features are on/off factors covered pairwise: every family meets every feature both on and off,
each dtype and each mesh, and every two features meet in all four combinations.

And bfloat16 where it counts: in a bfloat16 train step every dot and convolution multiplies
bfloat16 operands (accumulating in float32 where asked), forward and backward.
"""

import dataclasses
import importlib
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import configs
from vit_jax import models
from vit_jax.benchmarks import lowering
from vit_jax.training import steps
from vit_jax.loop import train
from vit_jax.models import attention
from vit_jax.models import numerics
from vit_jax.schema import setting
from vit_jax.schema import run as run_settings
from vit_jax.training import start as start_lib
from vit_jax.schema import step as step_settings

FAMILIES = configs.family_configs()
FEATURES = ('teacher', 'mixing', 'ema', 'micro_batches', 'scan_remat', 'positional')
TEACHER = 'vit_ti4'


@dataclasses.dataclass(frozen=True)
class Case:
  family: str
  features: frozenset[str]
  dtype: str
  fsdp: int

  def __str__(self) -> str:
    mesh = 'fsdp=8' if self.fsdp == 8 else 'data=8'
    return f"{self.family}[{'+'.join(sorted(self.features)) or 'plain'}|{self.dtype}|{mesh}]"


def family_config(
    family: str, features: frozenset[str] = frozenset(), dtype: str = 'float32', fsdp: int = 1
):
  """The family config's quick run with `features` switched on."""
  config = importlib.import_module(f'vit_jax.configs.{family}').get_config()
  config.dtype = dtype
  config.mesh.fsdp = fsdp
  config.mesh.fsdp_min_size = 0  # Shard the quick model's parameters too.
  if 'teacher' in features:
    config.distillation.type = 'hard'
  if 'mixing' in features:
    config.mixup_alpha, config.cutmix_alpha = 0.8, 1.0
  if 'ema' in features:
    config.ema_decay = 0.999
  if 'micro_batches' in features:
    config.grad_accum_steps = 2
  if 'scan_remat' in features:
    config.model.scan_layers = config.model.remat = True
  if 'positional' in features:
    config.model.attention = 'learned_content'
    if 'class_stage' in models.fields(config.model.name):  # It takes the patch tokens only.
      config.model.class_stage = 'class_attention'
  return config


def not_applicable(family: str) -> frozenset[str]:
  """The features the family's quick model cannot have: scanned blocks and positional attention
  where it has no such fields (RegNetY), positional attention where a distillation token needs
  the class stage that positional attention excludes (DeiT)."""
  config = family_config(family)
  fields = models.fields(config.model.name)
  distilled = getattr(models.create_model(config, 10), 'distilled', False)
  return frozenset(
      feature
      for feature, applies in (
          ('scan_remat', 'scan_layers' in fields),
          ('positional', 'attention' in fields and not distilled),
      )
      if not applies
  )


def _rows(family: str, index: int, on: tuple[str, ...]) -> tuple[Case, Case]:
  """A family's two cases: row A, float32, with the features `on`, and row B, bfloat16, with
  exactly the other applicable ones; row A is on fsdp=8 for the first, third, ... family and on
  data parallelism for the others, row B on the other mesh."""
  first_fsdp, second_fsdp = (8, 1) if index % 2 == 0 else (1, 8)
  others = set(FEATURES) - NOT_APPLICABLE[family] - set(on)
  return (
      Case(family, frozenset(on), 'float32', first_fsdp),
      Case(family, frozenset(others), 'bfloat16', second_fsdp),
  )


def _covered(cases: tuple[Case, ...]) -> set[tuple]:
  """What cases cover: every two applicable features' on/off, each feature on in a dtype and a
  mesh."""
  covered: set[tuple] = set()
  for case in cases:
    applicable = sorted(set(FEATURES) - NOT_APPLICABLE[case.family])
    on = case.features
    covered |= {(f, f in on, g, g in on) for f, g in itertools.combinations(applicable, 2)}
    covered |= {(f, case.dtype) for f in on} | {(f, case.fsdp) for f in on}
  return covered


def _cases() -> list[Case]:
  """Each family's two rows (`_rows`), row A's features chosen to cover the most that the families
  before it left uncovered; of the rows that tie, those nearest half the features, the family's
  index picking among them (so that later families vary)."""
  cases: list[Case] = []
  covered: set[tuple] = set()
  for index, family in enumerate(FAMILIES):
    applicable = sorted(set(FEATURES) - NOT_APPLICABLE[family])
    score = lambda rows: (
        len(_covered(rows) - covered),
        -abs(2 * len(rows[0].features) - len(applicable)),
    )
    choices = [
        _rows(family, index, on)
        for size in range(len(applicable) + 1)
        for on in itertools.combinations(applicable, size)
    ]
    top = max(map(score, choices))
    tied = [rows for rows in choices if score(rows) == top]
    best = tied[index % len(tied)]
    covered |= _covered(best)
    cases.extend(best)
  return cases


NOT_APPLICABLE = {family: not_applicable(family) for family in FAMILIES}
CASES = _cases()


def test_cases_cover_every_pair_of_factors():
  """Every family x (feature on/off, dtype, mesh), and every two features in all 4 combinations."""
  for family in FAMILIES:
    rows = [c for c in CASES if c.family == family]
    applicable = set(FEATURES) - NOT_APPLICABLE[family]
    assert {(f in c.features) for c in rows for f in applicable} == {True, False}
    assert {c.dtype for c in rows} == {'float32', 'bfloat16'}
    assert {c.fsdp for c in rows} == {1, 8}
  for f, g in itertools.combinations(FEATURES, 2):
    seen = {
        (f in c.features, g in c.features) for c in CASES if not {f, g} & NOT_APPLICABLE[c.family]
    }
    assert seen == set(itertools.product((True, False), repeat=2)), (f, g, seen)
  for feature, dtype, fsdp in itertools.product(FEATURES, ('float32', 'bfloat16'), (1, 8)):
    assert any(feature in c.features and c.dtype == dtype for c in CASES), (feature, dtype)
    assert any(feature in c.features and c.fsdp == fsdp for c in CASES), (feature, fsdp)


@pytest.mark.parametrize('case', CASES, ids=str)
def test_train_and_eval_steps_export_for_tpu_and_cuda(case):
  config = family_config(case.family, case.features, case.dtype, case.fsdp)
  exported = lowering.export_steps(
      config,
      10,
      lowering.abstract_mesh(case.fsdp),
      batch_size=16,
      case=str(case),
      teacher_model=TEACHER if 'teacher' in case.features else None,
  )
  for name in ('train', 'eval'):
    assert exported[name].platforms == lowering.PLATFORMS, (case, name)
    assert exported[name].nr_devices == 8, (case, name)
  # The state's layouts (Shardy's attributes in the module): some parameters split over fsdp=8,
  # none under data parallelism (whose batch goes over 'data' and the size-1 'fsdp' together).
  assert ('{"fsdp"}' in exported['train'].mlir_module()) == (case.fsdp == 8), case
  if case.dtype == 'bfloat16':
    for name in ('train', 'eval'):
      products = lowering.matrix_products(exported[name].mlir_module())
      assert products and not not_allowed(products), (case, name)


def test_cudnn_attention_cannot_be_cross_lowered_and_the_error_names_case_step_and_op():
  """cuDNN attention asks the local cuDNN while tracing: it is checked on a GPU (`python -m
  vit_jax.benchmark --mode=device_report`), and here only for the clear error."""
  config = family_config('vit', dtype='bfloat16', fsdp=8)
  config.model.attention_implementation = 'cudnn'
  with pytest.raises(
      lowering.LoweringError,
      match=r'vit\[cudnn\]: the set-up of the steps does '
      r"not lower for \['tpu', 'cuda'\]: .*cuDNN.*models/numerics\.py:\d+ "
      r'`.*dot_product_attention',
  ):
    lowering.export_steps(config, 10, lowering.abstract_mesh(8), batch_size=16, case='vit[cudnn]')


# Float32-operand products a bfloat16 step may keep: predicate on the product, and why.
ALLOWED_FLOAT32_PRODUCTS = {
    # attention_implementation='xla' hands attention to jax.nn.dot_product_attention, whose
    # backward pass meets the float32 cotangent of the scores with bfloat16 queries and keys in a
    # dot whose algorithm (BF16_BF16_F32) rounds both operands to bfloat16: it runs at bfloat16
    # rate although an operand is typed float32.
    'bfloat16 algorithm': lambda product: product.bfloat16_algorithm,
    # The Gaussian positional scores' inverse covariances A_h A_h^T: a 2x2 product of parameters
    # per head, kept float32 because the scores' quadratic form in the offsets (up to the grid
    # size squared) magnifies their rounding; a few dozen multiply-adds per step.
    'Gaussian inverse covariance': lambda product: '_gaussian_scores/' in product.name,
}


def not_allowed(products: list[lowering.MatrixProduct]) -> list[lowering.MatrixProduct]:
  """The float32-operand products that no entry of `ALLOWED_FLOAT32_PRODUCTS` explains."""
  return [
      p
      for p in products
      if p.float32_operand and not any(allowed(p) for allowed in ALLOWED_FLOAT32_PRODUCTS.values())
  ]


def float32_products(config) -> tuple[list[lowering.MatrixProduct], int]:
  """The float32-operand products, not allowed, of `config`'s jitted train step, and the count of
  all its products."""
  program = lowering.step_programs(config, 10, lowering.abstract_mesh(1, 1), batch_size=8)[0]
  text = (
      program.function.trace(*program.arguments)
      .lower(lowering_platforms=('tpu',))
      .as_text(debug_info=True)
  )
  products = lowering.matrix_products(text)
  return not_allowed(products), len(products)


# Name -> (family, model fields): the models and attentions that the matrix's bfloat16 rows (whose
# module carries no op names) leave out, each named in a failure.
BFLOAT16_MODELS = {
    'vit': ('vit', {}),
    'sa_conv': ('sa_conv', {}),
    't2t_performer': ('t2t', {'name': 't2t_vit_ti4'}),
    'deepvit_layer_norm': ('deepvit', {'re_attention_norm': 'layer'}),
    'vit_map_pool': ('vit', {'global_pool': 'map'}),
    'vit_xla_attention': ('vit', {'attention_implementation': 'xla'}),
    'sa_conv_learned_content': ('sa_conv', {'attention': 'learned_content'}),
    'sa_conv_gaussian': ('sa_conv', {'attention': 'gaussian'}),
}


@pytest.mark.parametrize('name', BFLOAT16_MODELS)
def test_bfloat16_train_step_multiplies_bfloat16_operands(name):
  family, fields = BFLOAT16_MODELS[name]
  config = family_config(family, dtype='bfloat16')
  config.model.update(fields)
  bad, total = float32_products(config)
  assert total > 0
  assert not bad, f'{name}: {len(bad)} of {total} products take a float32 operand: ' + '; '.join(
      f'{p.name} {p.operand_types}' for p in bad
  )


def test_a_float32_operand_product_is_caught():
  config = family_config('vit', dtype='bfloat16')
  config.model.depth = 1
  bad, _ = float32_products(config)
  assert not bad
  original = numerics.einsum_float32
  try:  # The scores' plain float32-result einsum, as before einsum_float32.
    numerics.einsum_float32 = lambda spec, a, b: jnp.einsum(
        spec, a, b, preferred_element_type=jnp.float32
    )
    bad, _ = float32_products(config)
  finally:
    numerics.einsum_float32 = original
  assert bad and all('transpose' in p.name for p in bad), bad


@pytest.mark.parametrize(
    'spec, shapes',
    [('bqhd,bkhd->bhqk', ((2, 5, 3, 4), (2, 6, 3, 4))), ('bhqk,hg->bgqk', ((2, 3, 5, 5), (3, 3)))],
)
def test_einsum_float32_equals_einsum_with_gradients_in_the_operands_dtype(spec, shapes):
  a, b = (
      jax.random.normal(key, shape)
      for key, shape in zip(jax.random.split(jax.random.key(0), 2), shapes)
  )
  weights = jax.random.normal(jax.random.key(1), jnp.einsum(spec, a, b).shape)
  loss = lambda f, a, b: jnp.sum(f(spec, a, b) * weights)
  reference = lambda spec, a, b: jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)
  np.testing.assert_allclose(numerics.einsum_float32(spec, a, b), reference(spec, a, b), rtol=1e-6)
  for ours, theirs in zip(
      jax.grad(loss, (1, 2))(numerics.einsum_float32, a, b),
      jax.grad(loss, (1, 2))(reference, a, b),
  ):
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
  a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
  assert numerics.einsum_float32(spec, a16, b16).dtype == jnp.float32
  grads = jax.grad(loss, (1, 2))(numerics.einsum_float32, a16, b16)
  assert [g.dtype for g in grads] == [jnp.bfloat16, jnp.bfloat16]
  for ours, theirs in zip(grads, jax.grad(loss, (1, 2))(reference, a, b)):
    np.testing.assert_allclose(np.asarray(ours, np.float32), theirs, rtol=0.05, atol=0.05)


@pytest.mark.e2e
@pytest.mark.parametrize('name', ['vit', 'cait', 'deepvit', 't2t_performer'])
def test_bfloat16_step_stays_within_bfloat16_tolerance_of_float32(name):
  """Logits, loss and the first update of the bfloat16 step against the float32 step's, for
  one-block models of each attention whose products changed."""
  family, fields = {**BFLOAT16_MODELS, 'cait': ('cait', {}), 'deepvit': ('deepvit', {})}[name]
  results = {}
  for dtype in ('float32', 'bfloat16'):
    config = family_config(family, dtype=dtype)
    config.model.update(depth=1, **fields)
    start = start_lib.for_run(setting.build(run_settings.Settings, config), 10, lambda _: 1e-3)
    model, tx = start.model, start.tx
    state = jax.jit(start.init)()
    rng = np.random.default_rng(0)
    size = config.image_size
    batch = {
        'image': jnp.asarray(rng.normal(size=(8, size, size, 3)), jnp.float32),
        'label': jnp.asarray(rng.integers(0, 10, 8), jnp.int32),
    }
    variables = {
        'params': state.params,
        **({'batch_stats': state.batch_stats} if state.batch_stats else {}),
    }
    logits = jax.jit(model.apply)(variables, batch['image'])
    new_state, metrics = jax.jit(
        steps.make_train_step(model, tx, setting.build(step_settings.StepSettings, config), 10)
    )(state, batch)
    update = jax.tree.map(lambda new, old: new - old, new_state.params, state.params)
    results[dtype] = (
        np.asarray(logits, np.float32),
        float(metrics['loss']),
        np.concatenate([np.ravel(u) for u in jax.tree.leaves(update)]),
    )
  (logits32, loss32, update32), (logits16, loss16, update16) = (
      results['float32'],
      results['bfloat16'],
  )
  np.testing.assert_allclose(logits16, logits32, atol=0.05 * np.abs(logits32).max() + 0.02)
  assert abs(loss16 - loss32) < 0.02 * abs(loss32) + 0.01, (loss16, loss32)
  # Adam's first update is lr * sign(g) where g is not tiny: the directions must agree.
  large = np.abs(update32) > 0.5e-3
  agree = np.mean(np.sign(update16[large]) == np.sign(update32[large]))
  assert agree > 0.95, agree


def test_default_attention_equals_dot_product_attention_of_xla_with_gradients():
  """The default fast path (`softmax_attention`) computes what `jax.nn.dot_product_attention`
  does: its 'xla' implementation here, its 'cudnn' one on a GPU (`--mode=device_report`)."""
  module = attention.SelfAttention(num_heads=2)
  x = jax.random.normal(jax.random.key(1), (2, 9, 16))
  variables = module.init(jax.random.key(0), x)
  weights = jax.random.normal(jax.random.key(2), x.shape)

  def loss(variables, x, implementation):
    out = module.clone(fast_path_implementation=implementation).apply(variables, x)
    return jnp.sum(out * weights)

  both = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), static_argnums=2)
  ours, xla = both(variables, x, None), both(variables, x, 'xla')
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(xla)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

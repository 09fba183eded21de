"""Every shared model field reaches every block of every registered model.

Each model is built tiny with every shared field it has set to a value other than its default;
its initialisation is traced (no compilation) with an interceptor that records every module
called, and each field is checked where it must arrive.
"""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax.models import attention
from vit_jax.models import layers
from vit_jax.schema import parts
from vit_jax.models import stems
from vit_jax.models import vit

BF16 = jnp.dtype('bfloat16')
# Modules that compute in float32 whatever the model's dtype, by design: every BatchNorm, and
# head mixing and the Re-attention norm over heads (`attention.SelfAttention`).
_FLOAT32_BY_DESIGN = ('reattn_norm', 'proj_l', 'proj_w', 'reatten_matrix')
# Parameters kept in float32 whatever param_dtype is: T2T's frozen Performer features.
_FLOAT32_PARAMS = ('random_features',)
_ATTENTIONS = (attention.SelfAttention, attention.ClassAttention, attention.TokenAttention)


def _tiny(name: str) -> tuple[dict, int]:
  """Overrides that make model `name` tiny, and an image size that fits it."""
  fields = models.fields(name)
  preset = models.create(name)
  if isinstance(preset, vit.VisionTransformer):
    tiny = dict(
        hidden_size=16, num_heads=2, depth=3, token_dim=8, class_attention_depth=1, mlp_dim=None
    )
    if getattr(preset, 're_attention_blocks', None) is not None:
      tiny['re_attention_blocks'] = 1
    return tiny, max(16, 2 * preset.patch_size)
  if 'num_layers' in fields:  # SA-conv.
    return dict(hidden_size=16, intermediate_size=16, num_heads=2, num_layers=2), 16
  return dict(w0=8, wa=8.0, wm=2.0, depth=3, group_width=8, stem_width=8), 16  # RegNet.


def _shared_values(name: str) -> dict:
  """Every shared field the model has, set to a value other than its preset's."""
  preset = models.create(name)
  candidates = dict(
      attention_implementation='cudnn',
      dtype=BF16,
      param_dtype=BF16,
      mlp_activation='gelu_tanh',
      qkv_bias=not getattr(preset, 'qkv_bias', True),
      dropout_rate=0.125,
      attention_dropout_rate=0.25,
      drop_path_rate=0.375,
      layer_norm_eps=1e-3,
      scan_layers=True,
      remat=True,
      init_scheme='google' if getattr(preset, 'init_scheme', '') == 'timm' else 'timm',
  )
  return {k: v for k, v in candidates.items() if k in models.fields(name)}


def _build(name: str, **values):
  tiny, size = _tiny(name)
  model = models.create(name, num_classes=3, **tiny, **values)
  images = jnp.zeros((1, size, size, 3))
  called = []

  def record(next_fun, args, kwargs, context):
    called.append(context.module)
    return next_fun(*args, **kwargs)

  # With `intermediates` mutable the attention takes its explicit path, so the trace succeeds
  # whatever `attention_implementation` is; the fast path is tested by applying the model.
  init = functools.partial(model.init, mutable=True)
  with nn.intercept_methods(record):
    variables = jax.eval_shape(init, jax.random.key(0), images)
  return model, images, {k: v for k, v in variables.items() if k != 'intermediates'}, called


def _in_main_blocks(module: nn.Module) -> bool:
  return any(
      part.startswith(('blocks_', 'layers_')) and 'token_only' not in part for part in module.path
  )


@pytest.mark.parametrize('name', models.names())
def test_every_shared_field_reaches_every_block(name):
  values = _shared_values(name)
  model, images, variables, called = _build(name, **values)
  for field, value in values.items():
    assert getattr(model, field) == value, field
  assert called, name
  for module in called:
    where = f'{name}: {type(module).__name__} at {"/".join(module.path)}'
    if (
        'dtype' in values
        and hasattr(module, 'dtype')
        and not isinstance(module, nn.BatchNorm)
        and not set(module.path) & set(_FLOAT32_BY_DESIGN)
    ):
      assert module.dtype == BF16, where
    if 'param_dtype' in values and hasattr(module, 'param_dtype'):
      assert module.param_dtype == BF16, where
    if isinstance(module, _ATTENTIONS) and 'attention_implementation' in values:
      assert module.fast_path_implementation == 'cudnn', where
    if isinstance(module, (attention.SelfAttention, attention.ClassAttention)) and (
        'qkv_bias' in values
    ):
      assert module.qkv_bias == values['qkv_bias'], where
    if isinstance(module, layers.Mlp) and 'mlp_activation' in values:
      assert module.activation == 'gelu_tanh', where
    if _in_main_blocks(module):
      if isinstance(module, (attention.SelfAttention, attention.PositionalAttention)):
        assert module.attention_dropout_rate == values['attention_dropout_rate'], where
        # SA-conv's layer drops after its own projection, so its attention has no dropout.
        sa_conv_layer = module.path[0].startswith('layers_')
        assert module.dropout_rate == (0.0 if sa_conv_layer else values['dropout_rate']), where
      if isinstance(module, layers.EncoderBlock):
        assert module.dropout_rate == values['dropout_rate'], where
        assert module.layer_norm_eps == values['layer_norm_eps'], where
    if (
        isinstance(module, nn.LayerNorm)
        and 'layer_norm_eps' in values
        and (_in_main_blocks(module) or module.path[-1] == 'norm')
    ):
      assert module.epsilon == values['layer_norm_eps'], where
  for path, leaf in jax.tree_util.tree_leaves_with_path(variables['params']):
    if 'param_dtype' in values and path[-1].key not in _FLOAT32_PARAMS:
      assert leaf.dtype == BF16, (name, jax.tree_util.keystr(path))
  if values.get('scan_layers'):
    assert any('_to_' in key for key in variables['params']), list(variables['params'])
  if 'drop_path_rate' in values:
    rates = [
        m.rate
        for m in called
        if isinstance(m, layers.DropPath)
        and (_in_main_blocks(m) or models.family(name).name == 'regnet')
    ]  # RegNet: every block.
    assert rates, name
    static = [rate for rate in rates if isinstance(rate, float)]  # Scanned rates are traced.
    assert not static or max(static) == values['drop_path_rate'], (name, rates)


def _uses_fast_attention(model: nn.Module) -> bool:
  """Whether some attention of `model` takes the fast path with more than one query at inference
  (class attention's single query never goes to cuDNN)."""
  if not isinstance(model, vit.VisionTransformer):
    return False
  kinds = {model.block_attention(i) for i in range(model.depth)}
  return 'standard' in kinds or (
      model.stem == 't2t' and model.kind_settings(parts.T2TSettings).tokens_type == 'transformer'
  )


@pytest.mark.parametrize(
    'name', [n for n in models.names() if _uses_fast_attention(models.create(n))]
)
def test_cudnn_attention_raises_on_cpu_in_every_family_with_standard_attention(name):
  model, images, variables, _ = _build(name, attention_implementation='cudnn')
  with pytest.raises(RuntimeError, match='cuDNN'):
    jax.eval_shape(model.apply, variables, images)
  xla = dataclasses.replace(model, attention_implementation='xla')
  assert jax.eval_shape(xla.apply, variables, images).shape == (1, 3)


@pytest.mark.parametrize('name', ['cait_ti4', 'deepvit_ti4', 't2t_vit_t_ti4', 'sa_conv_learned'])
def test_remat_reaches_the_blocks(name):
  tiny, size = _tiny(name)
  images = jnp.zeros((1, size, size, 3))

  def jaxpr(remat: bool) -> str:
    model = models.create(name, num_classes=3, remat=remat, **tiny)
    variables = jax.eval_shape(model.init, jax.random.key(0), images)
    loss = lambda v, p: jnp.sum(model.apply({**v, 'params': p}, images, mutable=True)[0])
    return str(jax.make_jaxpr(jax.grad(loss, argnums=1))(variables, variables['params']))

  assert 'checkpoint' in jaxpr(True) or 'remat' in jaxpr(True)
  assert 'checkpoint' not in jaxpr(False) and 'remat' not in jaxpr(False)


def test_family_protocol_declares_converters():
  assert tuple(f.name for f in models.families()) == models.family_modules()
  for name in models.names():
    family = models.family(name)
    assert models.family(models.create(name)) is family
    assert (family.from_torch is None) == (family.to_torch is None)
  assert models.family('deit_ti16').from_torch is vit.from_timm
  assert stems.names()[0] == 'patch'


def _first_of_each_family() -> list[str]:
  firsts: dict[str, str] = {}
  for name in models.names():
    firsts.setdefault(models.family(name).name, name)
  return sorted(firsts.values())


@pytest.mark.parametrize('name', _first_of_each_family())
def test_auto_attention_is_xla_on_cpu_with_the_same_logits(name):
  """The default implementation ('auto') runs every family on CPU without an error, as XLA, and
  computes the logits of the explicit XLA path."""
  tiny, size = _tiny(name)
  model = models.create(name, num_classes=3, **tiny)
  images = jax.random.normal(jax.random.key(3), (2, size, size, 3))
  variables = model.init(jax.random.key(0), images)
  assert getattr(model, 'attention_implementation', 'auto') == 'auto'
  assert all(p.implementation == 'xla' for p in attention.plan(model, size, train=False))
  auto = model.apply(variables, images)
  if hasattr(model, 'attention_implementation'):
    xla = dataclasses.replace(model, attention_implementation='xla').apply(variables, images)
    np.testing.assert_allclose(auto, xla, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    'field, value',
    [('hidden_size', -8), ('patch_size', 0), ('mlp_dim', -1), ('depth', 0)],
)
def test_a_size_below_one_is_one_problem_before_anything_is_built(field, value):
  (problem,) = models.section_problems({'name': 'vit_ti16', field: value}, '--config.')
  assert problem == f'--config.model: {field}={value} must be >= 1.'

"""The README's worked extension, "Add your own attention": a kind defined here, chosen with
--config.model.attention, trains through the loop and is analysed through its sown maps."""

import functools
import os

from absl import flags
import flax.linen as nn
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np
import pytest

from vit_jax import models
from vit_jax.training import train
from vit_jax.training import workdir as workdir_lib
from vit_jax.analysis import maps
from vit_jax.analysis import rollout
from vit_jax.models import attention

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CosineAttention(nn.Module):
  """Softmax over the cosine similarities of queries and keys times a learned temperature per
  head (the scaled cosine attention of Swin V2, in its plainest form)."""

  num_heads: int
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    batch, tokens, width = x.shape
    qkv = nn.Dense(3 * width, name='qkv')(x).reshape(batch, tokens, 3 * self.num_heads, -1)
    q, k, v = jnp.split(qkv, 3, axis=2)
    q, k = (t / jnp.linalg.norm(t, axis=-1, keepdims=True) for t in (q, k))
    temperature = self.param('temperature', nn.initializers.constant(10.0), (self.num_heads,))
    scores = jnp.einsum('bqhd,bkhd->bhqk', q, k) * temperature[:, None, None]
    # `attend` softmaxes, sows the probabilities to `intermediates` and weighs the values.
    heads = attention.attend(self, scores, v, dropout_rate=self.dropout_rate, train=train)
    return nn.Dense(width, name='proj')(heads.reshape(batch, tokens, width))


@pytest.fixture
def cosine_kind(monkeypatch):
  """'cosine' registered as an attention kind for the test only."""
  # pylint: disable-next=protected-access
  monkeypatch.setattr(attention, '_KINDS', dict(attention._KINDS))
  attention.register(
      'cosine',
      lambda model, grid: functools.partial(
          CosineAttention, num_heads=model.num_heads, dropout_rate=model.attention_dropout_rate
      ),
  )
  return 'cosine'


def config_from_command_line(*args: str):
  """The config `python -m vit_jax.main ARGS` would train: config_flags reads the file and applies
  the --config.FIELD overrides."""
  argv = ['main', *args]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=flag_values, sys_argv=argv)
  flag_values(argv)
  return flag_values.config


def test_a_new_attention_kind_trains_and_is_analysed(cosine_kind, tmp_path):
  assert cosine_kind in attention.kinds()
  config = config_from_command_line(
      f'--config={REPO}/configs/vit.py',
      f'--config.model.attention={cosine_kind}',
      f'--config.data_dir={tmp_path / "tfds"}',
      '--config.image_size=16',
      '--config.crop_padding=2',
      '--config.total_steps=2',
      '--config.warmup_steps=0',
      '--config.batch_size=32',
      '--config.eval_batch_size=64',
      '--config.log_every=1',
      '--config.model.hidden_size=32',
      '--config.model.depth=2',
      '--config.model.num_heads=2',
      '--config.model.mlp_dim=64',
  )
  workdir = str(tmp_path / 'run')
  result = train.train_and_evaluate(config, workdir)
  assert result.step == 2 and result.metrics['count'] > 0

  model = models.create_model(config, num_classes=10)
  variables = workdir_lib.Workdir(workdir).read_variables(use_ema=False).variables
  block = variables['params']['blocks_0']['attn']
  assert set(block) == {'qkv', 'temperature', 'proj'}
  assert not np.allclose(block['temperature'], 10.0)  # Trained.

  images = jax.random.uniform(jax.random.key(0), (3, 16, 16, 3))
  layers = maps.attention_maps(model, variables, images)
  assert [layer.name for layer in layers] == ['blocks_0/attn', 'blocks_1/attn']
  assert [layer.shape for layer in layers] == [(2, 17, 17)] * 2  # Heads, [cls] + 4 x 4 patches.
  np.testing.assert_allclose(layers[0].probs.sum(-1), 1.0, atol=1e-5)
  (relevance,) = rollout.token_relevance(layers, (16, 16))
  assert relevance.maps.shape == (3, 4, 4)
  with pytest.raises(ValueError, match="attention='banana' is not valid; choose from .*'cosine'"):
    models.create_model(
        config_from_command_line(
            f'--config={REPO}/configs/vit.py', '--config.model.attention=banana'
        ),
        10,
    ).check_fields()

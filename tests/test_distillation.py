"""DeiT distillation: the loss against a direct evaluation, and a student trained from a teacher."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.tiny_runs import tiny_config
from vit_jax.training import steps
from vit_jax.loop import train


def reference_loss(cls_logits, dist_logits, targets, teacher_logits, kind, alpha, tau):
  """deit/losses.py DistillationLoss, written out in NumPy."""

  def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))

  base = np.mean(-(targets * log_softmax(cls_logits)).sum(-1))
  if kind == 'hard':
    hard = np.eye(cls_logits.shape[-1])[teacher_logits.argmax(-1)]
    kd = np.mean(-(hard * log_softmax(dist_logits)).sum(-1))
  else:
    lt, ls = log_softmax(teacher_logits / tau), log_softmax(dist_logits / tau)
    kd = (np.exp(lt) * (lt - ls)).sum() * tau**2 / dist_logits.size
  return (1 - alpha) * base + alpha * kd


@pytest.mark.parametrize(
    'kind, alpha, tau', [('hard', 0.5, 1.0), ('soft', 0.5, 1.0), ('soft', 0.3, 3.0)]
)
def test_distillation_loss_matches_deit(kind, alpha, tau):
  rng = np.random.default_rng(0)
  cls_logits, dist_logits, teacher = (rng.normal(size=(6, 5)) * 3 for _ in range(3))
  targets = rng.dirichlet(np.ones(5), size=6)
  ours = steps.distillation_loss(
      (jnp.asarray(cls_logits), jnp.asarray(dist_logits)),
      jnp.asarray(targets),
      jnp.asarray(teacher),
      kind=kind,
      alpha=alpha,
      tau=tau,
  )
  expected = reference_loss(cls_logits, dist_logits, targets, teacher, kind, alpha, tau)
  np.testing.assert_allclose(float(ours), expected, rtol=1e-5)


def test_teacher_gets_no_gradient():
  teacher = jnp.array([[2.0, -1.0, 0.5]])
  grad = jax.grad(
      lambda t: steps.distillation_loss(
          jnp.zeros((1, 3)), jnp.eye(3)[:1], t, kind='soft', alpha=0.5, tau=2.0
      )
  )(teacher)
  assert np.all(grad == 0)


def test_distilled_deit_student_trains_from_a_vit_teacher(tmp_path, train_losses):
  data_dir = str(tmp_path / 'tfds')
  teacher_dir = str(tmp_path / 'teacher')
  train.train_and_evaluate(tiny_config(data_dir, total_steps=30, base_lr=3e-3), teacher_dir)

  config = tiny_config(data_dir, total_steps=30, base_lr=3e-3, log_every=10)
  config.model.name = 'deit_ti16_distilled'
  config.model.patch_size = 2
  config.distillation.type = 'hard'
  config.distillation.teacher = teacher_dir
  metrics = train.train_and_evaluate(config, str(tmp_path / 'student')).metrics
  assert train_losses[-1] < train_losses[0], train_losses
  assert metrics['count'] == 360


def test_missing_teacher_is_a_clear_error(tmp_path):
  config = tiny_config(str(tmp_path / 'tfds'))
  config.distillation.type = 'hard'
  config.distillation.teacher = str(tmp_path / 'nowhere')
  with pytest.raises(ValueError, match='distillation.teacher='):
    train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()

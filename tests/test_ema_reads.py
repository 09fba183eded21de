"""A run's weights are read EMA first everywhere (eval_only, init_from, teacher, export, analysis),
and `use_ema=False` reads the raw ones."""

import json
import os

import pytest

from tests.tiny_runs import assert_trees_close, tiny_config
from vit_jax import models
from vit_jax.weights import inference
from vit_jax.weights import pretrained as pretrained_lib
from vit_jax.training import steps
from vit_jax.training import teacher
from vit_jax.loop import train
from vit_jax.schema import setting
from vit_jax.schema import step as step_settings
from vit_jax.workdir import reader


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  """A tiny trained run that kept an EMA: (config, workdir, final metrics, saved state)."""
  root = tmp_path_factory.mktemp('ema')
  config = tiny_config(str(root / 'tfds'), ema_decay=0.9)
  workdir = str(root / 'run')
  metrics = train.train_and_evaluate(config, workdir).metrics
  return config, workdir, metrics, reader.Workdir(workdir).read_state()


def test_restore_variables_reads_the_ema_unless_told_otherwise(run):
  _, workdir, _, state = run
  run = reader.Workdir.open(workdir)
  saved = run.read_variables()
  assert saved.ema and saved.step == state['step']
  assert_trees_close(saved.variables['params'], state['ema']['params'], atol=0)
  saved = run.read_variables(use_ema=False)
  assert not saved.ema
  assert_trees_close(saved.variables['params'], state['params'], atol=0)
  assert run.read_variables(unrolled=True).ema  # What export writes.
  assert not run.read_variables(use_ema=False, unrolled=True).ema


@pytest.mark.parametrize('use_ema', [True, False])
def test_eval_only_of_a_workdir_scores_what_training_reported(run, tmp_path, use_ema):
  config, workdir, metrics, _ = run
  config = config.copy_and_resolve_references()
  config.eval_only, config.use_ema = True, use_ema
  report = train.train_and_evaluate(config, workdir).metrics
  assert report['accuracy'] == pytest.approx(metrics['ema_accuracy' if use_ema else 'accuracy'])
  assert report['loss'] == pytest.approx(metrics['ema_loss' if use_ema else 'loss'], rel=1e-5)
  with open(os.path.join(workdir, 'eval_report.json')) as f:
    assert json.load(f)['use_ema'] is use_ema


def test_init_from_teacher_and_analysis_read_the_ema(run, tmp_path):
  config, workdir, _, state = run
  config = config.copy_and_resolve_references()
  config.init_from = workdir
  model = models.create_model(config, 10)
  pretrained = pretrained_lib.load(
      config.init_from,
      model,
      image_size=config.image_size,
      use_ema=config.use_ema,
      reset_head=True,
      rng=steps.init_rngs(config.seed)[0],
  )  # As fine-tuning reads it.
  assert_trees_close(pretrained['params'], state['ema']['params'], atol=1e-7)
  read = lambda c: teacher.load(
      setting.build_unless_off(step_settings.TeacherSettings, c), 10
  ).variables['params']
  config.distillation.type, config.distillation.teacher = 'hard', workdir
  assert_trees_close(read(config), state['ema']['params'], atol=0)
  config.use_ema = False
  assert_trees_close(read(config), state['params'], atol=0)
  loaded = inference.load_run(workdir, unroll=True)  # As analysis reads it.
  assert loaded.ema
  assert_trees_close(loaded.variables['params'], state['ema']['params'], atol=0)
  assert not inference.load_run(workdir, use_ema=False).ema

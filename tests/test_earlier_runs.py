"""A work directory that an earlier vit_jax wrote keeps evaluating and resuming.

`golden/run_of_aa0eb3c`: a tiny ViT (width 16, one block, an EMA) trained 4 steps on the embedded
digits by vit_jax at commit aa0eb3c, before the settings were dataclasses of `vit_jax.schema` and
the packages layers; its config.json, dataset.json, results.json and checkpoint as that commit
wrote them.
"""

import json
import pathlib
import shutil

import pytest

from vit_jax.loop import train
from vit_jax.workdir import reader

EARLIER_RUN = pathlib.Path(__file__).resolve().parent / 'golden' / 'run_of_aa0eb3c'


def test_an_earlier_run_evaluates_then_resumes(tmp_path, data_dir):
  workdir = str(tmp_path / 'run')
  shutil.copytree(EARLIER_RUN, workdir)
  config = reader.Workdir(workdir).config()
  config.data_dir = data_dir

  recorded = json.loads((EARLIER_RUN / 'results.json').read_text())

  config.eval_only = True  # Its EMA weights, as the earlier vit_jax measured them at the end.
  evaluated = train.train_and_evaluate(config, workdir).metrics
  assert evaluated['loss'] == pytest.approx(recorded['test_ema_loss'], abs=1e-6)
  assert evaluated['accuracy'] == recorded['test_ema_accuracy']

  config.eval_only, config.total_steps = False, 6
  resumed = train.train_and_evaluate(config, workdir)
  assert (resumed.step, resumed.preempted) == (6, False)
  assert {'accuracy', 'ema_accuracy'} <= set(resumed.metrics)
  assert reader.Workdir(workdir).read_variables().step == 6

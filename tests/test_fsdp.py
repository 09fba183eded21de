"""Fully sharded training: the sharding rule, and runs on 8 CPU devices that equal replicated ones.

The runs need 8 devices, which XLA only creates before JAX starts, so one subprocess trains them
all (`runs`), and compares one train step on 1 and on 8 devices, and this process, with its one
device, reads their checkpoints: which also shows that a sharded run reads back whole on any
other mesh.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
from conftest import OLDER_EMITTERS
import pytest
from jax.sharding import PartitionSpec as P

from tests.tiny_runs import final_params, tiny_config
from vit_jax import models
from vit_jax.weights import pretrained
from vit_jax.parallel import sharding
from vit_jax.loop import train
from vit_jax.workdir import reader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 6
MIDDLE = 3  # The step of the first checkpoint.
TOLERANCE = 1e-5  # float32; the two layouts only reduce gradients in another order.


@pytest.mark.parametrize(
    'shape, fsdp, min_size, expected',
    [
        ((24, 96), 8, 0, P(None, 'fsdp')),  # The largest divisible axis...
        ((96, 24), 8, 0, P('fsdp')),
        ((12, 40, 3), 4, 0, P(None, 'fsdp')),
        ((30, 16), 8, 0, P(None, 'fsdp')),  # ... skipping a larger one that is not.
        ((64, 64), 8, 0, P('fsdp')),  # Ties: the first.
        ((3, 10), 8, 0, P()),  # Nothing divisible: replicated.
        ((8, 8), 8, 65, P()),  # Too small: replicated.
        ((8, 8), 8, 64, P('fsdp')),
        ((), 8, 0, P()),  # Scalars (step, counts).
        ((1024, 4096), 1, 0, P()),  # fsdp=1: plain data parallelism.
    ],
)
def test_fsdp_rule(shape, fsdp, min_size, expected):
  assert sharding.fsdp_spec(shape, fsdp, min_size) == expected


def test_mesh_of_one_device_replicates_everything():
  mesh = sharding.make_mesh(1)
  assert dict(mesh.shape) == {'data': 1, 'fsdp': 1}
  tree = {'kernel': np.zeros((64, 32), np.float32), 'mu': np.zeros((64, 32), jax.numpy.bfloat16)}
  shardings = sharding.fsdp_shardings(tree, mesh, min_size=0)
  assert all(s.spec == P() for s in jax.tree.leaves(shardings))
  assert sharding.bytes_per_device(tree, shardings) == 64 * 32 * (4 + 2)


@pytest.mark.parametrize(
    'fsdp, message',
    [
        (3, r'mesh.fsdp=3: must divide the number of devices \(1\); valid: \[1\]'),
        (0, r'mesh.fsdp=0: must be an integer >= 1'),
    ],
)
def test_fsdp_that_does_not_divide_the_devices_is_refused(fsdp, message, tmp_path):
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(
        tiny_config(str(tmp_path / 'tfds'), **{'mesh.fsdp': fsdp}), str(tmp_path / 'run')
    )
  assert not (tmp_path / 'run').exists()


# Every run shards arrays of any size (`fsdp_min_size=0`), so that these tiny models are split.
SMALL = {
    'mesh.fsdp_min_size': 0,
    'total_steps': STEPS,
    'log_every': MIDDLE,
    'checkpoint_every': MIDDLE,
    'model.dropout_rate': 0.1,
    'model.drop_path_rate': 0.1,
}
MODELS = {
    'vit': {},
    'cait': {
        'model.name': 'cait_ti4',
        'model.depth': 3,
        'model.scan_layers': True,
        'model.class_attention_depth': 1,
    },
    'deepvit': {'model.name': 'deepvit_ti4', 'model.depth': 3, 'model.re_attention_blocks': 2},
    # The rest of the recipe at once: a distilled DeiT learning from the replicated ViT run
    # (its teacher sharded like itself), with EMA, micro-batches, remat and mixup/CutMix.
    'recipe': {
        'model.name': 'deit_ti16_distilled',
        'model.patch_size': 4,
        'model.remat': True,
        'distillation.type': 'soft',
        'ema_decay': 0.9,
        'grad_accum_steps': 2,
        'mixup_alpha': 0.8,
        'cutmix_alpha': 1.0,
    },
}


def runs(root: str) -> list[dict]:
  """Every run of the subprocess, in order: name, work directory, config overrides, and the run
  whose first checkpoint it starts from."""
  items = []
  for name, overrides in MODELS.items():
    for fsdp in (1, 8):
      items.append(
          {'name': f'{name}_fsdp{fsdp}', 'overrides': {**SMALL, **overrides, 'mesh.fsdp': fsdp}}
      )
      if 'distillation.type' in overrides:
        items[-1]['overrides']['distillation.teacher'] = os.path.join(root, 'vit_fsdp1')
  # Saved at fsdp=8 at step MIDDLE (the fsdp=8 ViT's checkpoint, alone in its work directory as a
  # preemption there leaves it), resumed at fsdp=2.
  items.append(
      {'name': 'resumed', 'overrides': {**SMALL, 'mesh.fsdp': 2}, 'start_from': 'vit_fsdp8'}
  )
  for item in items:
    item['workdir'] = os.path.join(root, item['name'])
  return items


SCRIPT = """
import json, os, shutil, sys, time
os.environ['XLA_FLAGS'] = os.environ['XLA_FLAGS'].replace({older_emitters!r}, '')
os.environ['XLA_FLAGS'] += ' --xla_force_host_platform_device_count=8'  # After conftest's.
os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'
sys.path.insert(0, {repo!r})
import jax
from tests.tiny_runs import tiny_config
from vit_jax.loop import train
assert jax.device_count() == 8
workdirs = {{}}
for run in json.loads({runs!r}):
  if 'start_from' in run:
    source = workdirs[run['start_from']]
    shutil.copytree(os.path.join(source, 'checkpoints', str({middle})),
                    os.path.join(run['workdir'], 'checkpoints', str({middle})))
    shutil.copy(os.path.join(source, 'config.json'), run['workdir'])
  workdirs[run['name']] = run['workdir']
  start = time.time()
  train.train_and_evaluate(tiny_config({data_dir!r}, **run['overrides']), run['workdir'])
  print(run['name'], round(time.time() - start, 1), 's', flush=True)

# One train step from the same state and batch, on the first device alone and data parallel on 8.
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from vit_jax.training import optim
from vit_jax.training import steps
from vit_jax.schema import setting
from vit_jax.schema import run as run_settings
from vit_jax.schema import step as step_settings
from vit_jax.training import start as start_lib
config = tiny_config({data_dir!r}, **{{'model.dropout_rate': 0.1, 'model.drop_path_rate': 0.2}})
settings = setting.build(run_settings.Settings, config)
schedule = optim.learning_rate_schedule(settings.schedule, 10, 0)
start = start_lib.for_run(settings, 10, schedule)
rng = np.random.default_rng(0)
batch = {{'image': rng.normal(size=(32, 16, 16, 3)).astype(np.float32),
         'label': rng.integers(0, 10, size=(32,)).astype(np.int32)}}
params = []
for devices in (jax.devices()[:1], jax.devices()):
  mesh = Mesh(np.array(devices), ('data',))
  replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P('data'))
  state = jax.device_put(start.init(), replicated)
  step = jax.jit(
      steps.make_train_step(start.model, start.tx, setting.build(step_settings.StepSettings, config), 10))
  state, _ = step(state, {{k: jax.device_put(v, sharded) for k, v in batch.items()}})
  params.append(jax.device_get(state.params))
difference = max(float(np.max(np.abs(a - b)))
                 for a, b in zip(jax.tree.leaves(params[0]), jax.tree.leaves(params[1])))
with open({one_step_file!r}, 'w') as f:
  json.dump({{'devices': [1, len(devices)], 'max_difference': difference}}, f)
"""


@pytest.fixture(scope='module')
def eight_devices(tmp_path_factory) -> dict:
  """Runs the 8-device process: 'workdirs', the work directory of each run of `runs` by name;
  'one_train_step', the devices of the one-step comparison and the largest parameter difference
  between them."""
  root = str(tmp_path_factory.mktemp('fsdp'))
  items = runs(root)
  one_step_file = os.path.join(root, 'one_train_step.json')
  script = SCRIPT.format(
      repo=REPO,
      runs=json.dumps(items),
      data_dir=os.path.join(root, 'tfds'),
      middle=MIDDLE,
      older_emitters=OLDER_EMITTERS,
      one_step_file=one_step_file,
  )
  result = subprocess.run(
      [sys.executable, '-c', script],
      capture_output=True,
      text=True,
      cwd=REPO,
      timeout=1500,
      check=False,
  )
  assert result.returncode == 0, result.stderr[-4000:]
  print(result.stdout)
  with open(one_step_file) as f:
    one_train_step = json.load(f)
  return {
      'workdirs': {item['name']: item['workdir'] for item in items},
      'one_train_step': one_train_step,
  }


@pytest.fixture(scope='module')
def trained(eight_devices) -> dict[str, str]:
  """The work directory of every run of `runs`, trained on 8 CPU devices, by name."""
  return eight_devices['workdirs']


def max_difference(a, b) -> float:
  assert jax.tree.structure(a) == jax.tree.structure(b)
  return max(
      (
          float(np.max(np.abs(np.asarray(x, np.float32) - np.asarray(y, np.float32))))
          for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
      ),
      default=0.0,
  )


def saved_layout(workdir: str) -> tuple[dict[str, tuple], dict[str, tuple]]:
  """The shape and the partition spec with which every parameter of the newest checkpoint of
  `workdir` was written, by path."""
  run = reader.Workdir(workdir)
  tree = run.manager.item_metadata(run.steps()[-1])['state'].tree
  flat = jax.tree_util.tree_flatten_with_path(tree['params'])[0]
  paths = [jax.tree_util.keystr(path) for path, _ in flat]
  return (
      {p: tuple(leaf.shape) for p, (_, leaf) in zip(paths, flat)},
      {p: tuple(leaf.sharding.partition_spec) for p, (_, leaf) in zip(paths, flat)},
  )


@pytest.mark.e2e
@pytest.mark.parametrize('name', MODELS)
def test_fsdp_8_trains_like_fsdp_1(trained, name):
  replicated, sharded = trained[f'{name}_fsdp1'], trained[f'{name}_fsdp8']
  # The sharded run really was: every kernel with an axis that 8 divides was written split.
  shapes, specs = saved_layout(sharded)
  kernels = [
      path
      for path in specs
      if path.endswith("['kernel']") and any(n % 8 == 0 for n in shapes[path])
  ]
  assert kernels and all('fsdp' in specs[path] for path in kernels), specs
  assert all('fsdp' not in spec for spec in saved_layout(replicated)[1].values())
  state_1, state_8 = (reader.Workdir(w).read_state() for w in (replicated, sharded))
  assert int(state_1['step']) == int(state_8['step']) == STEPS
  for part in ('params', 'opt_state', 'ema', 'batch_stats'):
    assert max_difference(state_1[part], state_8[part]) <= TOLERANCE, part
  # Training moved the parameters, so the agreement is not that of two idle models.
  assert (
      max_difference(state_1['params'], reader.Workdir(replicated).read_state(MIDDLE)['params'])
      > 1e-3
  )


@pytest.mark.e2e
def test_one_train_step_on_8_devices_equals_1_device(eight_devices):
  """One train step (dropout, stochastic depth) data parallel over 8 CPU devices gives the
  parameters of the same step on one device."""
  one_step = eight_devices['one_train_step']
  assert one_step['devices'] == [1, 8]
  assert one_step['max_difference'] <= TOLERANCE


@pytest.mark.e2e
def test_saved_at_fsdp_8_resumed_at_fsdp_2_equals_an_uninterrupted_run(trained):
  workdir = trained['resumed']
  assert reader.Workdir(workdir).steps() == [MIDDLE, STEPS]
  assert 'fsdp' in saved_layout(workdir)[1]["['head']['kernel']"]  # Written at fsdp=2.
  assert max_difference(final_params(workdir), final_params(trained['vit_fsdp8'])) <= TOLERANCE


@pytest.mark.e2e
def test_exported_weights_of_a_sharded_run_equal_a_replicated_ones(trained, tmp_path):
  model = models.create_model(tiny_config(''), 10)
  exported = []
  for name in ('vit_fsdp1', 'vit_fsdp8'):
    path = str(tmp_path / f'{name}.safetensors')
    pretrained.export_timm(pretrained.load(trained[name], model, image_size=16), model, path)
    exported.append(pretrained.load(path, model, image_size=16))
  assert max_difference(*exported) <= TOLERANCE

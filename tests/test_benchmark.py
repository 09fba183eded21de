"""`python -m vit_jax.benchmark`: every mode runs and reports its numbers (never asserts speed)."""

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image
import pytest

from vit_jax import models
from vit_jax.benchmarks import device_report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
    '--config=configs/vit.py',
    '--config.model.depth=2',
    '--config.model.hidden_size=32',
    '--config.model.num_heads=2',
    '--config.model.mlp_dim=64',
    '--image_size=16',
    '--steps=1',
    '--warmup=1',
    '--repeats=1',
]


def _benchmark(*args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  return subprocess.run(
      [sys.executable, '-m', 'vit_jax.benchmark', *args],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
  )


def _number(pattern: str, text: str) -> float:
  match = re.search(pattern, text)
  assert match, (pattern, text)
  return float(match.group(1))


def test_train_and_inference_against_timm(timm):
  del timm  # Only to skip where timm is absent.
  result = _benchmark(*TINY, '--batch=8', '--vs_timm')
  assert result.returncode == 0, result.stderr
  out = result.stdout
  for kind in ('train', 'inference'):
    ours = _number(rf'{kind} ours: +([\d.]+) images/s', out)
    theirs = _number(rf'{kind} timm: +([\d.]+) images/s', out)
    ratio = _number(rf'{kind} ratio: +([\d.]+)x', out)
    assert ours > 0 and theirs > 0
    assert ratio == pytest.approx(ours / theirs, rel=0.02)
    low, high = (
        float(x)
        for x in re.search(rf'{kind} ratio: .*block pairs ([\d.]+)-([\d.]+)x', out).groups()
    )
    assert 0 < low <= high
    fastest, slowest = (
        float(x) for x in re.search(rf'{kind} ours: .*blocks (\d+)-(\d+) ms/step', out).groups()
    )
    assert 0 <= fastest <= slowest
  # Our model and timm's twin have the same parameters.
  assert out.count('parameters:') == 1
  assert _number(r'train FLOPs: +([\d.]+) GFLOP/step', out) > 0
  assert _number(r'XLA train memory: +([\d.]+) MiB', out) > 0
  assert _number(r'peak host memory: +([\d.]+) MiB RSS \(both', out) > 0
  assert 'device:' in out and 'dtype float32' in out


def test_layers_row_times_a_scanned_rematerialised_model():
  result = _benchmark(*TINY, '--batch=4', '--layers_row=vit_ti4:1:1')
  assert result.returncode == 0, result.stderr
  row = json.loads(result.stdout.strip().splitlines()[-1])
  assert (row['model'], row['scan'], row['remat']) == ('vit_ti4', 1, 1)
  assert row['compile_s'] > 0 and row['step_s'] > 0 and row['peak_rss_mib'] > 0


def test_family_table_row_beside_its_plain_vit_twin():
  result = _benchmark(
      '--mode=family_table',
      '--family_models=sa_conv_quadratic',
      '--image_size=8',
      '--batch=2',
      '--steps=1',
      '--warmup=1',
      '--repeats=1',
  )
  assert result.returncode == 0, result.stderr
  row = next(line for line in result.stdout.splitlines() if line.startswith('sa_conv_quadratic'))
  size, width, depth, _, tokens, ms, vit_tokens, vit_ms, ratio, flop_ratio = row.split()[1:11]
  assert (size, width, depth, tokens, vit_tokens) == ('8', '400', '6', '16', '17')
  assert float(ms) > 0 and float(vit_ms) > 0 and float(ratio) > 0 and float(flop_ratio) > 1


@pytest.mark.parametrize(
    'args, message',
    [
        (['--layers_row=vit_ti4:2:0'], 'MODEL:SCAN:REMAT'),
        (['--mode=layers_table', '--layers_models=vit_tiny9'], 'unknown models'),
        (['--model=vit_zz'], "--model='vit_zz': unknown"),
        (['--steps=0'], '--steps=0'),
        (['--mode=input_pipeline', '--late_step=0'], '--late_step=0'),
        (
            ['--mode=input_pipeline', '--vs_timm'],
            "--vs_timm needs --config.augment='inception_crop'",
        ),
    ],
)
def test_bad_arguments_are_refused_before_compiling(args, message):
  result = _benchmark(*TINY, *args)
  assert result.returncode != 0
  assert message in result.stderr


def test_vs_timm_is_also_spelled_with_a_dash():
  result = _benchmark(*TINY, '--vs-timm', '--steps=0')  # Parsed, then refused for --steps.
  assert result.returncode != 0
  assert '--steps=0' in result.stderr and 'Unknown command line flag' not in result.stderr


def _jpeg_folder(root, classes=2, per_class=4):
  rng = np.random.default_rng(0)
  for c in range(classes):
    os.makedirs(os.path.join(root, 'train', f'class{c}'))
    for i in range(per_class):
      size = (48, 36) if i % 2 else (36, 48)
      pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
      Image.fromarray(pixels).save(os.path.join(root, 'train', f'class{c}', f'{i}.jpg'))
  return root


@pytest.mark.e2e
def test_input_pipeline_against_timm_on_a_jpeg_folder(timm, tmp_path):
  del timm  # Only to skip where timm is absent.
  root = _jpeg_folder(str(tmp_path / 'images'))
  result = _benchmark(
      '--mode=input_pipeline',
      '--vs_timm',
      f'--config=configs/deit.py:variant=Ti,image_size=32,dataset=folder:{root}',
      f'--data_dir={tmp_path / "tfds"}',
      '--batch=6',
      '--steps=1',
      '--warmup=0',
      '--repeats=1',
      '--late_step=4',
  )
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert 'rand-m9-mstd0.5-inc1, random erasing 0.25, repeated augmentation x3' in out
  assert _number(r'first batch: +([\d.]+) s \(the process', out) > 0
  per_core = {}
  for label in ('ours', 'timm'):
    images_per_s = _number(rf'{label}: +([\d.]+) images/s', out)
    per_core[label] = _number(rf'{label}: .* ([\d.]+) per core', out)
    # CPU clocks tick in 10 ms: a tiny batch may well read 0.
    assert images_per_s > 0 and _number(rf'{label}: .* ([\d.]+) ms CPU/image', out) >= 0
    assert per_core[label] == pytest.approx(images_per_s / len(os.sched_getaffinity(0)), rel=0.01)
  ratio = _number(r'ratio: +([\d.]+)x timm', out)
  assert ratio == pytest.approx(per_core['ours'] / per_core['timm'], rel=0.02)
  # Ours decodes each drawn image once for its three copies; timm decodes every copy.
  assert re.search(r'decodes: +ours 1/3 of the whole image .*; timm 1 of the whole image', out)
  # The recipe without repeated augmentation is compared too, decoding crop windows.
  assert 'repeated augmentation x1' in out
  assert _number(r'ratio no_repeat: +([\d.]+)x timm', out) > 0
  assert re.search(r'decodes no_repeat: +ours 1 of the crop window', out)
  # RandAugment, normalisation and erasing are the training step's, timed on JAX's device.
  assert re.search(r'batch: +6 x 32x32x3 uint8 and a key per image', out)
  assert _number(r'on device: +RandAugment, .* batch of 6: ([\d.]+) ms', out) > 0
  early = _number(r'first batch: +step 0: ([\d.]+) s', out)
  late = _number(r'step 4 \(24 examples consumed\): ([\d.]+) s', out)
  assert early > 0 and late > 0


def _bytes(pattern: str, text: str) -> float:
  """The size that `pattern` (one group: '12.5 MiB') finds in `text`, in bytes."""
  match = re.search(pattern + r' +([\d.,]+) (KiB|MiB|GiB)', text)
  assert match, (pattern, text)
  unit = {'KiB': 2**10, 'MiB': 2**20, 'GiB': 2**30}[match.group(2)]
  return float(match.group(1).replace(',', '')) * unit


def test_memory_mode_sizes_the_state_of_each_device_of_a_mesh():
  sizes = {}
  for fsdp in (1, 8):
    result = _benchmark(
        *TINY,
        '--batch=16',
        '--mode=memory',
        '--devices=8',
        f'--config.mesh.fsdp={fsdp}',
        '--config.mesh.fsdp_min_size=0',
        '--config.mu_dtype=bfloat16',
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f'data {8 // fsdp} x fsdp {fsdp} = 8 devices' in out
    sizes[fsdp] = {
        part: _bytes(rf'{part}:', out)
        for part in ('parameters', 'optimizer state', 'training state', 'XLA step memory')
    }
    sizes[fsdp]['arguments'] = _bytes('arguments', out)
  one, eight = sizes[1], sizes[8]
  # Replicated, each device holds every parameter; AdamW's moments (bfloat16 mu, float32 nu)
  # take 1.5 times as much, and are split exactly like the parameters.
  assert one['optimizer state'] == pytest.approx(1.5 * one['parameters'], rel=0.02)
  assert eight['optimizer state'] == pytest.approx(1.5 * eight['parameters'], rel=0.02)
  # Split 8 ways, except the few arrays with no axis that 8 divides (10 classes' head bias).
  assert one['parameters'] / 8 <= eight['parameters'] < one['parameters'] / 6
  # XLA's step takes the state as laid out (its arguments: the state and 2 images per device).
  for size in (one, eight):
    assert size['training state'] <= size['arguments'] <= size['XLA step memory']


def test_memory_mode_refuses_a_mesh_that_does_not_divide_the_devices():
  result = _benchmark(*TINY, '--mode=memory', '--devices=8', '--config.mesh.fsdp=3')
  assert result.returncode != 0
  assert 'mesh.fsdp=3: must divide the number of devices (8); valid: [1, 2, 4, 8]' in result.stderr


@pytest.mark.e2e  # The device report, every row.
def test_device_report_reduced_on_cpu(tmp_path, capsys):
  """The reduced report on CPU: every family trains (finite, falling loss), cuDNN is reported
  unavailable at every attention shape beside XLA's time, and the training and input pipeline
  rows carry their numbers."""
  report = tmp_path / 'report.json'
  device_report.run(json_path=str(report))
  printed = capsys.readouterr().out
  table = json.loads(report.read_text())
  assert table['platform'] == 'cpu' and table['reduced']
  rows = {row['check'].split(' (')[0]: row for row in table['rows']}
  for family in device_report.FAMILIES:
    row = rows[f'{family} training']
    assert row['ok'], row
    assert np.all(np.isfinite(row['numbers']['losses']))
  for shape in device_report.ATTENTION_SHAPES:  # Every family's token counts, cuDNN vs XLA.
    row = rows[f'attention {shape.name}']
    assert 'cuDNN unavailable on cpu' in row['result'] and row['numbers']['xla_ms'] > 0, row
    assert row['numbers']['chosen'] == 'xla' and row['ok'] is None
    assert set(row['numbers']['cudnn']) == set(
        device_report.cudnn_candidates(shape.queries, shape.keys)
    )
  assert 'MFU not reported' in rows['vit_ti4 training']['result']
  assert rows['vit_ti4 training']['numbers']['images_per_s'] > 0
  assert rows['input pipeline']['numbers']['images_per_s'] > 0
  for row in table['rows']:  # The printed table has every row.
    assert row['check'] in printed


def test_device_report_without_tensorflow_reports_the_rest_and_a_broken_check_fails_alone(
    monkeypatch, capsys
):
  """On a machine with JAX alone the input pipeline row says why it was not measured; a check
  that raises is a FAIL row naming its error, and the checks after it still run."""
  monkeypatch.setattr(device_report, 'FAMILIES', ('vit', 'no_such_family'))
  monkeypatch.setattr(device_report.runtime, 'tensorflow_installed', lambda: False)
  rows = device_report.run(reduced=True)
  printed = capsys.readouterr().out
  assert [row.ok for row in rows[:2]] == [True, False]
  assert rows[1].check == 'no_such_family training (bf16)'
  assert "ModuleNotFoundError: No module named 'vit_jax.configs.no_such_family'" in rows[1].result
  assert rows[-1].result == 'not measured: TensorFlow is not installed (pip install -e .)'
  assert 'FAIL' in printed and 'vit_ti4 training' in printed


def test_step_flops_count_the_matrix_products_of_a_training_step():
  """The lowered step's count is about three forward passes (forward, and the gradients of the
  activations and the weights): a count that left out the matrix products would be far lower."""
  config = device_report._reduced_config('vit')  # pylint: disable=protected-access
  batch = {
      'image': jax.ShapeDtypeStruct((8, 16, 16, 3), jnp.float32),
      'label': jax.ShapeDtypeStruct((8,), jnp.int32),
  }
  model = models.model_from_section(config.model.to_dict(), 10, 'float32')
  variables = jax.eval_shape(lambda x: model.init(jax.random.key(0), x), batch['image'])
  forward = device_report.step_flops(lambda v, x: model.apply(v, x), variables, batch['image'])
  step, _, flops = device_report._compiled_train_step(  # pylint: disable=protected-access
      config, {k: jnp.zeros(v.shape, v.dtype) for k, v in batch.items()}, 10
  )
  del step
  assert 2.5 < flops / forward < 4.0


def test_step_flops_of_a_matrix_product_from_its_shapes_alone():
  """2mkn for (m, k) x (k, n), counted for the host CPU from shapes: the arguments are never
  touched, so arrays on any device, or none, give the same count."""
  a, b = jax.ShapeDtypeStruct((8, 32), jnp.bfloat16), jnp.zeros((32, 4), jnp.bfloat16)
  assert device_report.step_flops(jnp.matmul, a, b) == 2 * 8 * 32 * 4


def test_cudnn_candidates_are_each_distinct_padding_and_include_the_models_choice():
  assert device_report.cudnn_candidates(197, 197) == {'unpadded': None, 'x128': 128}
  assert device_report.cudnn_candidates(50, 50) == {'unpadded': None, 'x128': 128, 'x64': 64}
  assert device_report.cudnn_candidates(3136, 3136) == {'unpadded': None, 'x128': 128}
  for shape in device_report.ATTENTION_SHAPES:
    candidates = device_report.cudnn_candidates(shape.queries, shape.keys)
    assert device_report.chosen_padding(shape.queries, shape.keys) in candidates, shape


def test_attention_rows_flag_nans_and_differences_of_the_chosen_padding(monkeypatch):
  """With cuDNN's call handed to XLA the chosen padding agrees; a kernel that returns NaN in the
  adversarial rows fails the row."""
  monkeypatch.setattr(device_report.numerics, 'accelerator', lambda: 'cuda')
  xla = jax.nn.dot_product_attention
  monkeypatch.setattr(jax.nn, 'dot_product_attention', lambda *a, implementation, **k: xla(*a, **k))
  shape = device_report.ATTENTION_SHAPES[1]
  row = device_report.attention_row(shape, reduced=True, repeats=1)
  assert row.ok and row.numbers['chosen'] == 'cudnn', row
  assert row.numbers['cudnn']['x128']['max_rel_diff'] < 2e-2
  assert 'chosen: cudnn x128' in row.result

  def nan_rows(*a, implementation, **k):
    out = xla(*a, **k)
    return out.at[:, 0].set(jnp.nan) if implementation == 'cudnn' else out

  monkeypatch.setattr(jax.nn, 'dot_product_attention', nan_rows)
  row = device_report.attention_row(shape, reduced=True, repeats=1)
  assert row.ok is False and ' NaN' in row.result


def test_device_report_measures_only_the_groups_asked_for(monkeypatch):
  monkeypatch.setattr(device_report.runtime, 'tensorflow_installed', lambda: False)
  rows = device_report.run(reduced=True, groups=('input',))
  assert [row.check for row in rows] == ['input pipeline']
  with pytest.raises(ValueError, match=r"Unknown device report rows \['kernels'\]; choose from"):
    device_report.run(reduced=True, groups=('attention', 'kernels'))

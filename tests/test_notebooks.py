"""Every notebook runs top to bottom with its small settings (VIT_JAX_NOTEBOOK_SMALL=1).

Each notebook executes in a fresh kernel of this Python, from the repository root, writing under a
temporary directory, offline. A failing cell fails the test with that cell's error.
"""

import os
import re

import pytest

nbclient = pytest.importorskip('nbclient')
nbformat = pytest.importorskip('nbformat')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(REPO, 'notebooks')


def run_notebook(name: str, tmp_path, monkeypatch, timeout: int = 600):
  """Executes notebooks/NAME; returns the executed notebook."""
  monkeypatch.setenv('VIT_JAX_NOTEBOOK_SMALL', '1')
  monkeypatch.setenv('VIT_JAX_NOTEBOOK_DIR', str(tmp_path))
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  monkeypatch.setenv('TF_CPP_MIN_LOG_LEVEL', '2')
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  notebook = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
  client = nbclient.NotebookClient(
      notebook, timeout=timeout, kernel_name='python3', resources={'metadata': {'path': REPO}}
  )
  client.execute()
  return notebook


def outputs(notebook) -> str:
  """Every text output of the executed notebook, joined."""
  parts = []
  for cell in notebook.cells:
    for output in cell.get('outputs', []):
      parts.append(output.get('text', ''))
      parts.append(output.get('data', {}).get('text/plain', ''))
  return '\n'.join(parts)


def number_after(text: str, prefix: str) -> float:
  """The number printed right after `prefix` in `text`."""
  return float(text.split(prefix, 1)[1].split()[0])


def images(notebook) -> int:
  return sum(
      'image/png' in output.get('data', {})
      for cell in notebook.cells
      for output in cell.get('outputs', [])
  )


def test_every_notebook_is_tested():
  tested = {
      '01_quickstart.ipynb',
      '02_attention_variants.ipynb',
      '03_sa_conv.ipynb',
      '04_pretrained.ipynb',
  }
  assert set(n for n in os.listdir(NOTEBOOKS) if n.endswith('.ipynb')) == tested


def test_notebooks_are_committed_without_outputs():
  for name in sorted(os.listdir(NOTEBOOKS)):
    if name.endswith('.ipynb'):
      notebook = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
      nbformat.validate(notebook)
      assert not any(cell.get('outputs') for cell in notebook.cells if cell.cell_type == 'code')
      assert notebook.metadata.kernelspec.name == 'python3'


def test_quickstart(tmp_path, monkeypatch):
  notebook = run_notebook('01_quickstart.ipynb', tmp_path, monkeypatch)
  text = outputs(notebook)
  assert 'small settings: True' in text
  assert 'Test accuracy' in text and 'on 360 images' in text
  assert "'eval/accuracy'" in text and "'train/loss'" in text
  assert 'of these 24 correct' in text
  assert 'pre-logits (24, 32)' in text and 'blocks_1   class token (24, 1, 32)' in text
  assert number_after(text, 'fewshot/digits_5shot') > 0.1  # Chance is 0.1.
  assert number_after(text, 'linear_probe/digits') > 0.1
  assert images(notebook) == 2  # The curves and the predictions.
  assert os.path.exists(tmp_path / 'quickstart' / 'results.json')


@pytest.mark.e2e
def test_attention_variants(tmp_path, monkeypatch):
  notebook = run_notebook('02_attention_variants.ipynb', tmp_path, monkeypatch)
  text = outputs(notebook)
  for name in (
      'vit_ti4',
      'deit_ti16_distilled',
      'cait_ti4',
      'deepvit_ti4',
      't2t_vit_t_ti4',
      'sa_conv_quadratic',
  ):
    assert name in text
  for label in ('ViT', 'DeiT', 'CaiT', 'DeepViT', 'T2T-ViT', 'SA-conv'):
    assert re.search(
        rf'^{re.escape(label)} +\d attention layers; main stage 3 blocks', text, re.MULTILINE
    ), label
  assert 'main stage 3 blocks of 9 heads x 64 queries x 64 keys' in text  # SA-conv: 16x16 / 2.
  assert images(notebook) == 2 + 6 + 1  # Two summaries, a collapse plot per model, overlays.
  for family in ('vit', 'deit', 'cait', 'deepvit', 't2t', 'sa_conv'):
    assert os.path.exists(tmp_path / 'variants' / f'collapse_{family}.png')


def test_sa_conv(tmp_path, monkeypatch):
  notebook = run_notebook('03_sa_conv.ipynb', tmp_path, monkeypatch)
  text = outputs(notebook)
  assert 'Test accuracy' in text and 'centres of mass' in text
  for line in (
      '3x3 kernel, dilation 1: 9 heads',
      '3x3 kernel, dilation 2: 9 heads',
      '5x5 kernel, dilation 1: 25 heads',
  ):
    assert number_after(text, line + ', max |attention - convolution| = ') < 1e-4
  assert images(notebook) == 3  # Centres, contours, the heads of the convolution.
  assert os.path.exists(tmp_path / 'sa_conv' / 'analysis' / 'centres.png')


def test_pretrained_offline(tmp_path, monkeypatch, timm):
  del timm  # Imported by the notebook itself; the fixture skips the test without it.
  notebook = run_notebook('04_pretrained.ipynb', tmp_path, monkeypatch)
  text = outputs(notebook)
  assert 'built offline (random weights)' in text
  assert 'pos_embed (1, 197, 192) -> (1, 5, 192)' in text  # 14x14 -> 2x2 patches + class token.
  assert 'head      (1000, 192) -> (192, 10)' in text
  assert number_after(text, '224 px, 1,000 classes: max |vit_jax - timm| = ') < 1e-4
  assert 'fine-tuned from offline random weights: test accuracy' in text
  assert number_after(text, 'timm with the exported weights: max |vit_jax - timm| = ') < 1e-4

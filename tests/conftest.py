"""Shared pytest fixtures."""

import os

import pytest

_torchvision_schemas = []  # Keeps the op-schema library alive for the whole session.


@pytest.fixture(scope='session')
def timm():
  """The timm package, importable offline despite the CUDA-only torchvision wheel."""
  os.environ.setdefault('HF_HUB_OFFLINE', '1')
  torch = pytest.importorskip('torch')
  try:
    lib = torch.library.Library('torchvision', 'DEF')
    lib.define('nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
    lib.define('qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
    _torchvision_schemas.append(lib)
  except RuntimeError:  # Another import in this process declared them already.
    pass
  return pytest.importorskip('timm')

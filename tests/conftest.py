"""Shared pytest fixtures."""

import os

import pytest

_libraries = []  # Keeps the torchvision operator schemas registered for the session.


@pytest.fixture(scope='session')
def timm():
  """The timm package, imported offline on CPU torch (PyPI's torchvision is a CUDA build)."""
  os.environ.setdefault('HF_HUB_OFFLINE', '1')
  torch = pytest.importorskip('torch')
  if not _libraries:
    library = torch.library.Library('torchvision', 'DEF')
    library.define('nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
    library.define('qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
    _libraries.append(library)
  return pytest.importorskip('timm')

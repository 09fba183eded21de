"""timm, the reference implementation that the benchmark, the input benchmark and the tests run
beside ours, importable where PyPI's torchvision (a CUDA build) sits beside a CPU-only torch, and
where PyPI's CUDA torch brings Triton into a process that has loaded TensorFlow."""

import sys
import types

# Keeps the declared torchvision operators alive for the process.
_TORCHVISION_SCHEMAS: list[object] = []


def import_timm() -> types.ModuleType:
  """timm; a torchvision whose C++ operators do not register gets their schemas declared (all timm
  needs), and torch is shown no Triton (loaded after TensorFlow's, its compiler crashes the
  process; the reference runs eagerly). ImportError without torch or timm."""
  sys.modules.setdefault('triton', None)  # type: ignore[arg-type]
  import torch  # pylint: disable=g-import-not-at-top

  try:
    import torchvision  # pylint: disable=g-import-not-at-top,unused-import
  except (RuntimeError, ImportError):
    if not _TORCHVISION_SCHEMAS:
      library = torch.library.Library('torchvision', 'DEF')
      library.define('nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
      library.define('qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
      _TORCHVISION_SCHEMAS.append(library)
  import timm  # pylint: disable=g-import-not-at-top

  return timm

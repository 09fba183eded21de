"""timm, the reference implementation that the benchmark, the input benchmark and the tests run
beside ours, importable where PyPI's torchvision (a CUDA build) sits beside a CPU-only torch."""

import types

_TORCHVISION_SCHEMAS = []  # Keeps the declared torchvision operators alive for the process.


def import_timm() -> types.ModuleType:
  """timm, also where torchvision is a CUDA build beside a CPU-only torch (as PyPI's is).

  Such a torchvision fails to register its C++ operators; timm needs only their schemas, so
  they are declared instead. Raises ImportError without torch or timm.
  """
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

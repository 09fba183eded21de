"""timm, the reference implementation that the benchmark, the input benchmark and the tests run
beside ours, importable where PyPI's torchvision (a CUDA build) sits beside a CPU-only torch, and
where PyPI's CUDA torch brings Triton into a process that has loaded TensorFlow."""

import sys
import types

# Keeps the declared torchvision operators alive for the process.
_TORCHVISION_SCHEMAS: list[object] = []


def import_timm() -> types.ModuleType:
  """timm, also where torchvision is a CUDA build beside a CPU-only torch (as PyPI's is).

  Such a torchvision fails to register its C++ operators; timm needs only their schemas, so
  they are declared instead. torchvision's import asks whether Triton is installed by importing
  it, and Triton's compiler, loaded after TensorFlow's, crashes the process (PyPI's Linux torch
  wheels depend on Triton); the reference runs eagerly and never compiles, so torch is shown no
  Triton. Raises ImportError without torch or timm.
  """
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

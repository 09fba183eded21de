"""Datasets that vit_jax provides itself; everything else comes from TFDS by name.

Their names are declared here, where reading them imports nothing (the config schema checks them
when a config file is loaded; `unknown` asks TFDS, without TensorFlow, about any other name):
`DIGITS` (the embedded scikit-learn digits, `digits.py`) and `FOLDER_PREFIX` (your own images,
'folder:/path/to/images', `folder.py`).
"""

import os

DIGITS = "digits"
FOLDER_PREFIX = "folder:"
NONE_CHOSEN = ""  # A family config's published size given no dataset= (`chosen`).


def absolute(name: str) -> str:
  """`name` with an image folder's path made absolute (and `~` expanded): what a run records,
  so that it names the same folder from wherever it is read."""
  if not name.startswith(FOLDER_PREFIX) or "://" in name:
    return name
  path = name[len(FOLDER_PREFIX) :]
  return FOLDER_PREFIX + os.path.abspath(os.path.expanduser(path))


def chosen(name: str) -> bool:
  """Whether a dataset was chosen; raises ValueError, naming the one to add, where a family
  config's published size (variant=) came without one: the quick default's 8×8 digits do not fit
  a model published at 224 (or 32) pixels with that data's recipe."""
  if name == NONE_CHOSEN:
    raise ValueError(
        "must name a dataset (a non-empty string). A published size (variant=) "
        "needs the dataset it was published on: add "
        "dataset=imagenet2012 after the config file's colon (dataset=cifar10 for the "
        "32-pixel sizes), e.g. --config='configs/vit.py:variant=S/16,"
        "dataset=imagenet2012' --config.data_dir=DIR; or drop variant= for the quick "
        "model on the embedded digits."
    )
  return isinstance(name, str)


def named(name: str) -> bool:
  """The config's rule for `dataset`: a dataset was `chosen` and it is not `unknown`; raises
  ValueError saying why otherwise."""
  if not chosen(name):
    return False
  why = unknown(name)
  if why is not None:
    raise ValueError(why)
  return True


def unknown(name: str) -> str | None:
  """Why `name` names no dataset (neither ours nor a TFDS builder), or None if it names one.

  Imports TFDS, not TensorFlow, and only for a name that is not ours. A name in a TFDS community
  namespace ('huggingface:mnist') is left to TFDS when the dataset is read.
  """
  if name == DIGITS or name.startswith(FOLDER_PREFIX):
    return None
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  try:
    parsed, _ = tfds.core.naming.parse_builder_name_kwargs(name)
    if parsed.namespace:
      return None
    tfds.builder_cls(parsed.name)
  except (tfds.core.registered.DatasetNotFoundError, ValueError):
    return (
        f"no such dataset. Valid: {DIGITS!r} (embedded), "
        f"'{FOLDER_PREFIX}/path/to/images' (your own images) or a TFDS dataset name, e.g. "
        "'cifar10', 'cifar100', 'imagenet2012' (tfds.list_builders())."
    )
  return None

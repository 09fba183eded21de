"""The layouts a model's variables come in, and the conversions between them.

PyTorch state dicts: `variables_from_torch`/`variables_to_torch` turn a state dict with PyTorch's
module names and tensor layouts into Flax variables of the same names and back (transposes and
renames, for every family), and `checked_keys` refuses, for any family, keys outside the layout
its converter reads. Each family module names its converters after the layout they read
(`vit.from_timm`, `deepvit.from_dvit_repo`, `t2t.from_t2t_repo`).

Scanned stacks: a scanned model (`scan_layers`, `layers.apply_blocks`) holds blocks
`{prefix}_{a}` .. `{prefix}_{b}` as one stack `{prefix}_{a}_to_{b}` with a leading layer axis;
`unstack_layers`/`stack_layers` convert to and from the unrolled layout; `layer_axes` counts a
variable's leading layer axes, for what treats parameters one by one (the weight-decay mask,
LAMB's trust ratio).
"""

import re
from typing import Any, Mapping, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np


def checked_keys(
    state_dict: Mapping[str, Any], layout: re.Pattern[str], source: str
) -> Mapping[str, Any]:
  """`state_dict`, after checking that every key is one of `layout`'s; ValueError naming the keys
  outside it and `source`, the code that defines the layout."""
  unknown = [key for key in state_dict if not layout.fullmatch(key)]
  if unknown:
    raise ValueError(
        f'Keys outside the {source} layout: {unknown[:20]}'
        f'{f" (and {len(unknown) - 20} more)" if len(unknown) > 20 else ""}.'
    )
  return state_dict


def _module_path(parts: list[str]) -> list[str]:
  """['blocks', '3', 'attn'] -> ['blocks_3', 'attn']: PyTorch list indices join their parent."""
  path: list[str] = []
  for part in parts:
    if part.isdigit() and path:
      path[-1] = f'{path[-1]}_{part}'
    else:
      path.append(part)
  return path


def variables_from_torch(state_dict: Mapping[str, Any]) -> dict[str, dict]:
  """PyTorch state dict -> Flax variables by timm's `VisionTransformer` key names.

  The key names are timm/models/vision_transformer.py's.

  Linear weight -> kernel W^T; Conv weight (O, I, kh, kw) -> kernel (kh, kw, I, O); 1-D weight
  (LayerNorm, BatchNorm) -> scale; BatchNorm running_mean/var -> batch_stats mean/var
  (num_batches_tracked dropped); any other tensor (tokens, position embeddings, LayerScale) is
  copied. Module `a.3.b` becomes `a_3/b`.
  """
  variables: dict[str, dict] = {}
  for key, value in state_dict.items():
    value = np.asarray(value)
    *modules, leaf = key.split('.')
    collection = 'params'
    if leaf == 'num_batches_tracked':
      continue
    if leaf in ('running_mean', 'running_var'):
      collection, leaf = 'batch_stats', leaf[len('running_') :]
    elif leaf == 'weight':
      if value.ndim == 1:
        leaf = 'scale'
      elif value.ndim == 2:
        leaf, value = 'kernel', value.T
      elif value.ndim == 4:
        leaf, value = 'kernel', value.transpose(2, 3, 1, 0)
      else:
        raise ValueError(f'{key}: no rule for a weight of shape {value.shape}.')
    node = variables.setdefault(collection, {})
    for name in _module_path(modules):
      node = node.setdefault(name, {})
    node[leaf] = value
  return variables


def variables_to_torch(variables: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """The inverse of `variables_from_torch`: Flax variables (unrolled or scanned) -> PyTorch."""
  state_dict: dict[str, np.ndarray] = {}
  variables = unstack_layers(variables)
  for collection in ('params', 'batch_stats'):
    flat = flax.traverse_util.flatten_dict(dict(variables.get(collection, {})))
    for path, value in flat.items():
      value = np.asarray(value)
      *modules, leaf = path
      if collection == 'batch_stats':
        leaf = f'running_{leaf}'
      elif leaf == 'kernel':
        leaf, value = 'weight', value.T if value.ndim == 2 else value.transpose(3, 2, 0, 1)
      elif leaf == 'scale':
        leaf = 'weight'
      names = [re.sub(r'_(\d+)$', r'.\1', name) for name in modules]
      state_dict['.'.join(names + [leaf])] = value
  return state_dict


def block_indices(name: str, prefix: str) -> np.ndarray | None:
  """The indices of the blocks that variable collection `name` holds: [i] for `{prefix}_{i}`,
  [a, ..., b] for a scanned stack `{prefix}_{a}_to_{b}`; None for any other name."""
  single = re.fullmatch(rf'{re.escape(prefix)}_(\d+)', name)
  if single:
    return np.array([int(single.group(1))])
  stack = _SCANNED_NAME.fullmatch(name)
  if stack and stack.group(1) == prefix:
    return np.arange(int(stack.group(2)), int(stack.group(3)) + 1)
  return None


def layer_axes(path: Sequence[str]) -> int:
  """How many leading layer axes the variable at `path` (its names from the collection down) has:
  one for each scanned stack `{prefix}_{a}_to_{b}` on the path, none in an unrolled model."""
  return sum(1 for name in path if _SCANNED_NAME.fullmatch(name))


def scanned_name(prefix: str, first: int, last: int) -> str:
  """Name of the stack of blocks `{prefix}_{first}` .. `{prefix}_{last}` in a scanned model."""
  return f'{prefix}_{first}_to_{last}'


_SCANNED_NAME = re.compile(r'(.+)_(\d+)_to_(\d+)')


def unstack_layers(tree: Any) -> Any:
  """Scanned-model variables -> the unrolled `{prefix}_{i}` layout (inverse of `stack_layers`).

  Every `{prefix}_{a}_to_{b}` stack (leading layer axis) in any nested dict (params,
  batch_stats, intermediates, optimizer moments) becomes `{prefix}_{a}` .. `{prefix}_{b}`.
  """
  if not isinstance(tree, Mapping):
    return tree
  out = {}
  for key, value in tree.items():
    match = _SCANNED_NAME.fullmatch(str(key))
    if match and isinstance(value, Mapping):
      prefix, first, last = match.group(1), int(match.group(2)), int(match.group(3))
      for i in range(last - first + 1):
        out[f'{prefix}_{first + i}'] = jax.tree.map(lambda x, i=i: x[i], dict(value))
    else:
      out[key] = unstack_layers(value)
  return out


def stack_layers(tree: Any, like: Any) -> Any:
  """Unrolled variables -> the layout of `like`, e.g. a scanned model's `jax.eval_shape(init)`.

  Blocks `{prefix}_{a}` .. `{prefix}_{b}` are stacked wherever `like` has `{prefix}_{a}_to_{b}`.
  """
  if not isinstance(tree, Mapping) or not isinstance(like, Mapping):
    return tree
  out = {key: value for key, value in tree.items()}
  for key, value in like.items():
    match = _SCANNED_NAME.fullmatch(str(key))
    if match and key not in tree:
      prefix, first, last = match.group(1), int(match.group(2)), int(match.group(3))
      names = [f'{prefix}_{i}' for i in range(first, last + 1)]
      missing = [name for name in names if name not in tree]
      if missing:
        raise ValueError(f'Cannot stack {key}: the variables lack {missing}.')
      out[key] = jax.tree.map(lambda *xs: jnp.stack(xs), *[dict(out.pop(n)) for n in names])
    elif key in tree:
      out[key] = stack_layers(tree[key], value)
  return out

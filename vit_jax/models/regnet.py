"""RegNetY (Radosavovic et al., "Designing Network Design Spaces", CVPR 2020): the CNN teacher.

DeiT's headline results distil from RegNetY-16GF (Touvron et al. 2021). The layout is timm's
`timm/models/regnet.py` (parameter names included, so `from_timm`/`to_timm` are renames): a
3x3/2 conv-BN-ReLU stem of `stem_width`, then stages of bottleneck blocks — 1x1 conv-BN-ReLU,
3x3 grouped conv-BN-ReLU (stride 2 in a stage's first block), squeeze-and-excitation, 1x1
conv-BN, plus the shortcut (1x1/2 conv-BN where the shape changes), then ReLU — global average
pooling and a linear head. Stage widths and depths come from the paper's quantised linear rule
(Section 3.3) in `stage_widths`. BatchNorm uses PyTorch's eps 1e-5 and momentum 0.1
(Flax momentum 0.9) and its running statistics when `train=False`; Flax averages the biased batch
variance, PyTorch the unbiased one (a factor n/(n-1) in the running variance only).
"""

import functools
import math
import re
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import models
from vit_jax.models import Dtype
from vit_jax.models import layers
from vit_jax.models import layouts

_WIDTH_QUANTUM = 8


def stage_widths(
    w0: int, wa: float, wm: float, depth: int, group_width: int, bottleneck_ratio: float = 1.0
) -> list[tuple[int, int, int]]:
  """(width, blocks, group width) of every stage, as timm's `generate_regnet` and
  `adjust_widths_groups_comp` compute them (in float32, as they do).

  Block j has width u_j = w0 + wa * j, snapped to w0 * wm^round(log(u_j / w0) / log(wm)) and
  rounded to a multiple of 8 (paper Section 3.3); blocks of equal width form a stage. The bottleneck
  width is then rounded to a multiple of the group width (clipped to the bottleneck width).
  """
  continuous = np.arange(depth, dtype=np.float32) * np.float32(wa) + np.float32(w0)
  exponents = np.round(np.log(continuous / np.float32(w0)) / np.float32(math.log(wm)))
  widths = np.round(np.float32(w0) * np.power(np.float32(wm), exponents) / _WIDTH_QUANTUM)
  widths = (widths * _WIDTH_QUANTUM).astype(np.int64)
  stages = []
  for width, blocks in zip(*np.unique(widths, return_counts=True)):
    bottleneck = int(int(width) * bottleneck_ratio)
    groups = min(group_width, bottleneck)
    bottleneck = int(round(bottleneck / groups) * groups)
    stages.append((int(bottleneck / bottleneck_ratio), int(blocks), groups))
  return stages


def conv_kernel_init(
    kernel_size: int, features: int, groups: int = 1
) -> nn.initializers.Initializer:
  """timm's RegNet conv init: N(0, 2 / fan_out), fan_out = k * k * out / groups."""
  return nn.initializers.normal(stddev=math.sqrt(2.0 * groups / (kernel_size**2 * features)))


class ConvBN(nn.Module):
  """timm's `ConvNormAct` without its activation: conv (no bias, PyTorch padding) + BatchNorm."""

  features: int
  kernel_size: int = 1
  stride: int = 1
  groups: int = 1
  zero_init_scale: bool = False
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    pad = (self.stride - 1 + self.kernel_size - 1) // 2  # timm `get_padding`.
    x = nn.Conv(
        self.features,
        (self.kernel_size,) * 2,
        strides=(self.stride,) * 2,
        padding=((pad, pad), (pad, pad)),
        feature_group_count=self.groups,
        use_bias=False,
        kernel_init=conv_kernel_init(self.kernel_size, self.features, self.groups),
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name='conv',
    )(x)
    scale_init = nn.initializers.zeros if self.zero_init_scale else nn.initializers.ones
    x = nn.BatchNorm(
        use_running_average=not train,
        momentum=0.9,
        epsilon=1e-5,
        use_fast_variance=False,
        scale_init=scale_init,
        dtype=jnp.float32,
        param_dtype=self.param_dtype,
        name='bn',
    )(x)
    return x.astype(self.dtype)


class SqueezeExcite(nn.Module):
  """timm's `SEModule`: x * sigmoid(fc2(relu(fc1(mean over space of x)))), 1x1 convs."""

  reduced: int
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    channels = x.shape[-1]
    conv = functools.partial(
        nn.Conv, kernel_size=(1, 1), dtype=self.dtype, param_dtype=self.param_dtype
    )
    s = jnp.mean(x.astype(jnp.float32), axis=(1, 2), keepdims=True).astype(self.dtype)
    s = nn.relu(conv(self.reduced, kernel_init=conv_kernel_init(1, self.reduced), name='fc1')(s))
    s = conv(channels, kernel_init=conv_kernel_init(1, channels), name='fc2')(s)
    return x * nn.sigmoid(s)


class Bottleneck(nn.Module):
  """RegNetY block (timm `Bottleneck`): SE after the grouped conv, the last BN zero-initialised.

  The SE bottleneck is `se_ratio` x the block's input width, as in timm and pycls.
  """

  features: int
  stride: int = 1
  group_width: int = 1
  bottleneck_ratio: float = 1.0
  se_ratio: float = 0.25
  drop_path_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    in_features = x.shape[-1]
    bottleneck = int(round(self.features * self.bottleneck_ratio))
    conv_bn = functools.partial(ConvBN, dtype=self.dtype, param_dtype=self.param_dtype)
    y = nn.relu(conv_bn(bottleneck, name='conv1')(x, train=train))
    y = nn.relu(
        conv_bn(bottleneck, 3, self.stride, bottleneck // self.group_width, name='conv2')(
            y, train=train
        )
    )
    if self.se_ratio:
      y = SqueezeExcite(
          int(round(in_features * self.se_ratio)),
          dtype=self.dtype,
          param_dtype=self.param_dtype,
          name='se',
      )(y)
    y = conv_bn(self.features, zero_init_scale=True, name='conv3')(y, train=train)
    shortcut = x
    if in_features != self.features or self.stride != 1:
      shortcut = conv_bn(self.features, 1, self.stride, name='downsample')(x, train=train)
    return nn.relu(layers.DropPath(self.drop_path_rate)(y, train=train) + shortcut)


class RegStage(nn.Module):
  """Blocks of one width (timm `RegStage`, blocks `b1`, `b2`, ...); the first one has stride 2."""

  features: int
  group_width: int
  drop_path_rates: tuple[float, ...]
  bottleneck_ratio: float = 1.0
  se_ratio: float = 0.25
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    for j, rate in enumerate(self.drop_path_rates):
      x = Bottleneck(
          self.features,
          2 if j == 0 else 1,
          self.group_width,
          self.bottleneck_ratio,
          self.se_ratio,
          rate,
          dtype=self.dtype,
          param_dtype=self.param_dtype,
          name=f'b{j + 1}',
      )(x, train=train)
    layers.sow_feature(self, 'tokens', x)
    return x


class RegNet(nn.Module):
  """RegNet(Y) from its design-space parameters (timm `RegNetCfg`): w0, wa, wm, depth, group width.

  Input (B, H, W, 3); each stage halves the resolution (stride 32 in all with four stages), so
  any H, W works, down to 1x1 feature maps. `drop_path_rate` rises linearly over the blocks
  (timm); `dropout_rate` drops pooled features before the head. Returns float32 logits
  (`num_classes=0`: no head, the pooled features, as timm).
  """

  num_classes: int = 1000
  w0: int = 200
  wa: float = 106.23
  wm: float = 2.48
  depth: int = 18
  group_width: int = 112
  bottleneck_ratio: float = 1.0
  se_ratio: float = 0.25
  stem_width: int = 32
  drop_path_rate: float = 0.0
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def check_fields(self) -> None:
    """Raises ValueError for design-space parameters timm's generator would reject."""
    if self.num_classes < 0:
      raise ValueError(f'num_classes={self.num_classes} must be >= 0 (0: no head).')
    if self.depth < 1:
      raise ValueError(f'depth={self.depth} must be >= 1.')
    if self.w0 <= 0 or self.w0 % _WIDTH_QUANTUM:
      raise ValueError(f'w0={self.w0} must be a positive multiple of {_WIDTH_QUANTUM}.')
    if self.wa < 0 or self.wm <= 1:
      raise ValueError(f'wa={self.wa} must be >= 0 and wm={self.wm} > 1.')
    for name in ('group_width', 'stem_width'):
      if getattr(self, name) < 1:
        raise ValueError(f'{name}={getattr(self, name)} must be >= 1.')
    if not 0 < self.bottleneck_ratio <= 1 or not 0 <= self.se_ratio <= 1:
      raise ValueError(
          f'bottleneck_ratio={self.bottleneck_ratio} must be in (0, 1] and '
          f'se_ratio={self.se_ratio} in [0, 1].'
      )
    for name in ('drop_path_rate', 'dropout_rate'):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f'{name}={getattr(self, name)} must be in [0, 1).')

  @property
  def stages(self) -> list[tuple[int, int, int]]:
    """(width, blocks, group width) of every stage."""
    return stage_widths(
        self.w0, self.wa, self.wm, self.depth, self.group_width, self.bottleneck_ratio
    )

  @property
  def top_layer(self) -> int:
    """The last layer id of layer-wise lr decay (`layer_ids`), the head's: blocks + 1."""
    return sum(blocks for _, blocks, _ in self.stages) + 1

  def layer_ids(self, path: Sequence[str]) -> np.ndarray:
    """Layer-wise lr decay's layer of parameter `path` (timm's `RegNet.group_matcher`): the stem
    0, the blocks 1, 2, ... in order through the stages, the head `top_layer`."""
    if path[0] == 'stem':
      return np.array([0])
    stage = re.fullmatch(r's(\d+)', path[0])
    block = re.fullmatch(r'b(\d+)', path[1]) if stage and len(path) > 1 else None
    if stage and block:
      before = sum(blocks for _, blocks, _ in self.stages[: int(stage.group(1)) - 1])
      return np.array([before + int(block.group(1))])
    return np.array([self.top_layer])

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool = False) -> jax.Array:
    self.check_fields()
    if images.ndim != 4 or images.shape[-1] != 3:
      raise ValueError(f'Expected images of shape (batch, height, width, 3); got {images.shape}.')
    x = nn.relu(
        ConvBN(self.stem_width, 3, 2, dtype=self.dtype, param_dtype=self.param_dtype, name='stem')(
            images.astype(self.dtype), train=train
        )
    )
    stages = self.stages
    rates = np.linspace(0.0, self.drop_path_rate, sum(blocks for _, blocks, _ in stages))
    first = np.cumsum([0] + [blocks for _, blocks, _ in stages])
    for i, (width, blocks, group_width) in enumerate(stages):
      x = RegStage(
          width,
          group_width,
          tuple(float(r) for r in rates[first[i] : first[i + 1]]),
          self.bottleneck_ratio,
          self.se_ratio,
          dtype=self.dtype,
          param_dtype=self.param_dtype,
          name=f's{i + 1}',
      )(x, train=train)
    layers.sow_feature(self, 'encoded', x)
    x = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
    layers.sow_feature(self, 'head_input', x)
    if not self.num_classes:  # timm's num_classes=0: no head, the pooled features out.
      return x
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x).astype(self.dtype)
    logits = nn.Dense(
        self.num_classes,
        kernel_init=nn.initializers.normal(0.01),
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name='head',
    )(x)
    return logits.astype(jnp.float32)


# timm RegNet keys: stem, s{i}.b{j}.{conv1,conv2,conv3,downsample}.{conv,bn}, se.fc{1,2}, head.fc.
_TIMM_KEY = re.compile(
    r'(stem|s\d+\.b\d+\.(conv[123]|downsample))\.(conv\.weight|bn\.(weight|bias|running_mean'
    r'|running_var|num_batches_tracked))'
    r'|s\d+\.b\d+\.se\.fc[12]\.(weight|bias)|head\.fc\.(weight|bias)'
)


def from_timm(state_dict: models.StateDict) -> dict[str, dict]:
  """timm `RegNet` state dict -> Flax variables {'params', 'batch_stats'}."""
  layouts.checked_keys(state_dict, _TIMM_KEY, "timm's RegNet (timm models/regnet.py)")
  return layouts.variables_from_torch(
      {key.replace('head.fc.', 'head.'): value for key, value in state_dict.items()}
  )


def to_timm(variables: models.Variables) -> dict[str, np.ndarray]:
  """Flax variables -> timm `RegNet` state dict, loadable with `strict=True`."""
  state_dict = {}
  for key, value in layouts.variables_to_torch(variables).items():
    state_dict[re.sub(r'^head\.', 'head.fc.', key)] = value
    if key.endswith('.running_mean'):
      state_dict[key.replace('running_mean', 'num_batches_tracked')] = np.array(0, np.int64)
  return state_dict


def _regnety(w0: int, wa: float, wm: float, depth: int, group_width: int) -> functools.partial:
  return functools.partial(
      RegNet, w0=w0, wa=wa, wm=wm, depth=depth, group_width=group_width, se_ratio=0.25
  )


# timm's `model_cfgs` of the RegNetY family (pycls RegNetY-200MF ... -32GF); the digits give the
# FLOPs in units of 10^8 (regnety_160: 16 GF, DeiT's teacher).
MODELS = {
    'regnety_002': _regnety(24, 36.44, 2.49, 13, 8),
    'regnety_004': _regnety(48, 27.89, 2.09, 16, 8),
    'regnety_006': _regnety(48, 32.54, 2.32, 15, 16),
    'regnety_008': _regnety(56, 38.84, 2.4, 14, 16),
    'regnety_016': _regnety(48, 20.71, 2.65, 27, 24),
    'regnety_032': _regnety(80, 42.63, 2.66, 21, 24),
    'regnety_040': _regnety(96, 31.41, 2.24, 22, 64),
    'regnety_064': _regnety(112, 33.22, 2.27, 25, 72),
    'regnety_080': _regnety(192, 76.82, 2.19, 17, 56),
    'regnety_120': _regnety(168, 73.36, 2.37, 19, 112),
    'regnety_160': _regnety(200, 106.23, 2.48, 18, 112),
    'regnety_320': _regnety(232, 115.89, 2.53, 20, 232),
}
# timm names its RegNetYs as we do; its other arguments change training only.
TIMM_ARGUMENTS = {
    'in_chans': None,
    'num_classes': None,
    'global_pool': None,
    'drop_rate': None,
    'drop_path_rate': None,
}
FAMILY = models.Family(
    'regnet', RegNet, MODELS, from_timm, to_timm, {name: name for name in MODELS}, TIMM_ARGUMENTS
)

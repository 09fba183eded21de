"""The backbone's interchangeable parts, the settings every transformer family shares, and the
own settings of the part kinds that have any.

`Parts` declares the parts and shared settings once, with ViT's defaults; `vit.VisionTransformer`
(and so every family preset of it) has them as fields. A part kind's own settings are a small
frozen dataclass (`T2TSettings`, `PositionalSettings`, `ReAttentionSettings`,
`ClassAttentionSettings`) that the backbone holds in the part's one settings field
(`stem_settings`, `attention_settings`, `class_stage_settings`; None: the kind's defaults) and
hands to the part's module. The config schema (`vit_jax.config`) offers every field of both as
`--config.model.FIELD`, unset until a user sets it (the registered model's own value);
`models.create` puts a kind's settings given by field name into their dataclass. Declared apart
from the model, free of JAX, so that reading a config file imports neither.

- `stem`: 'patch' (ViT's patch embedding), 'cnn' (DeepViT's CNN stem), 't2t' (T2T-ViT's
  tokens-to-token module, `T2TSettings`), or 'space_to_depth' (SA-conv's); `vit_jax.models.stems`.
- `attention`: the attention kind of the main blocks, a name registered in
  `vit_jax.models.attention` ('standard', 'talking_heads', 're_attention' (`ReAttentionSettings`),
  Cordonnier et al.'s 'quadratic', 'gaussian', 'learned', 'learned_content',
  or your own: `attention.register`).
- `layer_scale_init`: CaiT's LayerScale: None (none), its initial value, or 'paper' (CaiT's
  depth rule, `layers.paper_layer_scale_init`).
- `class_stage`: 'token' (a class token from the first block) or 'class_attention' (CaiT's
  class-attention blocks after the patch blocks, `ClassAttentionSettings`).
- `distilled`: DeiT's distillation token and second head.
- `global_pool`: what the head reads: 'token', 'avg' or 'map'.
- `mlp_ratio`: the MLP width over the token width (the family's `default_mlp_ratio` when unset);
  a model gives its MLP width by `mlp_dim` or `mlp_ratio`, never both.
- `scan_layers`: each run of like blocks is one traced block run by `nn.scan`; `remat`: the blocks'
  activations are recomputed in the backward pass (`layers.apply_blocks`).
"""

import dataclasses
from typing import Any, Callable, ClassVar


@dataclasses.dataclass(kw_only=True)
class Parts:
  """The backbone's parts and shared settings, with ViT's defaults (see the module docstring)."""

  stem: str = 'patch'
  attention: str = 'standard'
  layer_scale_init: float | str | None = None
  class_stage: str = 'token'
  distilled: bool = False
  global_pool: str = 'token'
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  drop_path_rate: float = 0.0
  attention_implementation: str | None = None
  mlp_activation: str = 'gelu'
  qkv_bias: bool = True
  layer_norm_eps: float = 1e-6
  mlp_ratio: float | None = None
  scan_layers: bool = False
  remat: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class T2TSettings:
  """The 't2t' stem's own settings (`stems.TokensToToken`): its token block, 'performer' or
  'transformer', and that block's width; (kernel, stride, padding) of each soft split, T2T-ViT's
  for 224-pixel images by default."""

  part: ClassVar[str] = 'stem'
  tokens_type: str = 'performer'
  token_dim: int = 64
  soft_splits: tuple[tuple[int, int, int], ...] = ((7, 4, 2), (3, 2, 1), (3, 2, 1))


@dataclasses.dataclass(frozen=True, kw_only=True)
class PositionalSettings:
  """The own settings of Cordonnier et al.'s attention kinds (`attention.PositionalAttention`):
  the spread of the initial head centres and of the initial spreads around the identity, and the
  width of the learned offset embeddings (None: the token width)."""

  part: ClassVar[str] = 'attention'
  centre_init_std: float = 2.0
  spread_init_std: float = 0.01
  position_encoding_size: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReAttentionSettings:
  """The 're_attention' kind's own settings (`attention.SelfAttention`, DeepViT Eq. 3): the norm
  of the mixed maps over heads, 'batch' (the official code's BatchNorm) or 'layer' (lucidrains')."""

  part: ClassVar[str] = 'attention'
  re_attention_norm: str = 'batch'


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassAttentionSettings:
  """The 'class_attention' class stage's own settings (CaiT Section 3.2): how many
  class-attention blocks follow the patch blocks."""

  part: ClassVar[str] = 'class_stage'
  class_attention_depth: int = 2


# Every part kind's settings dataclass; each names its `part`, whose `{part}_settings` field of a
# model holds it.
KIND_SETTINGS = (T2TSettings, PositionalSettings, ReAttentionSettings, ClassAttentionSettings)


def settings_field(part: str) -> str:
  """The model field that holds the own settings of `part`'s chosen kind."""
  return f'{part}_settings'


def kind_settings_fields() -> dict[str, type]:
  """Each field of a kind's settings (`KIND_SETTINGS`) -> the dataclass that declares it."""
  return {
      field.name: settings for settings in KIND_SETTINGS for field in dataclasses.fields(settings)
  }


def part_fields() -> tuple[dataclasses.Field, ...]:
  """The fields a config's `model` section offers besides the registered model's own: the
  backbone's parts and shared fields (`Parts`), then those of the kinds' settings."""
  return dataclasses.fields(Parts) + tuple(
      field for settings in KIND_SETTINGS for field in dataclasses.fields(settings)
  )


# Model fields that say a part field's value in an earlier spelling, still accepted: the type a
# config holds, and the (part field, value) it spells (None: nothing).
FIELD_SPELLINGS: dict[str, tuple[type, Callable[[Any], tuple[str, Any] | None]]] = {
    'paper_layer_scale': (bool, lambda paper: ('layer_scale_init', 'paper') if paper else None),
}

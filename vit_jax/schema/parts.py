"""The backbone's interchangeable parts, the settings every transformer family shares, and the
own settings of the part kinds that have any.

`Parts` declares the parts and shared settings once, with ViT's defaults; `vit.VisionTransformer`
(and so every family preset of it) has them as fields. A part kind's own settings are a small
frozen dataclass (`T2TSettings`, `PositionalSettings`, `ReAttentionSettings`,
`ClassAttentionSettings`; a kind of your own registers its own: `register_settings`, which
`attention.register` and `stems.register` call with `settings=`) that the backbone holds in the part's one settings field
(`stem_settings`, `attention_settings`, `class_stage_settings`; None: the kind's defaults) and
hands to the part's module. The config schema (`vit_jax.config`) offers every field of both as
`--config.model.FIELD`, unset until a user sets it (the registered model's own value);
`models.create` puts a kind's settings given by field name into their dataclass. Declared apart
from the model, free of JAX, so that reading a config file imports neither.

- `stem`: 'patch' (ViT's patch embedding), 'cnn' (DeepViT's CNN stem), 't2t' (T2T-ViT's
  tokens-to-token module, `T2TSettings`), 'space_to_depth' (SA-conv's), or your own
  (`stems.register`); `vit_jax.models.stems`.
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
from typing import Any, Callable, ClassVar, Protocol, TypeVar

from vit_jax.process import extensions


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
  attention_implementation: str | None = 'auto'
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


# The parts whose kinds may have settings of their own, each held in the model's `{part}_settings`.
PARTS_WITH_SETTINGS = ('stem', 'attention', 'class_stage')


class KindSettings(Protocol):
  """A part kind's own settings: a frozen dataclass whose `part` names the part it belongs to."""

  part: ClassVar[str]
  __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]


KindSettingsT = TypeVar('KindSettingsT', bound=KindSettings)
_SETTINGS: list[type[KindSettings]] = []


def register_settings(
    settings: type[KindSettingsT], *, part: str | None = None
) -> type[KindSettingsT]:
  """Makes the fields of `settings`, a kind's frozen dataclass, `--config.model.FIELD=` of every
  config and `models.create(..., FIELD=...)` overrides; ValueError for a dataclass that is not
  frozen, names no part with settings (or not `part`, the part of the kind it comes with), or
  repeats a field of the parts or of other settings. Registering the same dataclass again changes
  nothing. Returns `settings` (a class decorator)."""
  params = getattr(settings, '__dataclass_params__', None)
  if params is None or not params.frozen:
    raise ValueError(f'{settings!r} must be a frozen dataclass to be kind settings.')
  valid = PARTS_WITH_SETTINGS if part is None else (part,)
  if getattr(settings, 'part', None) not in valid:
    raise ValueError(
        f'{settings.__name__}.part={getattr(settings, "part", None)!r} is not valid; choose from '
        f'{list(valid)}.'
    )
  if settings in _SETTINGS:
    return settings
  taken = {field.name: Parts.__name__ for field in dataclasses.fields(Parts)}
  taken.update({name: other.__name__ for name, other in kind_settings_fields().items()})
  clashes = {f.name: taken[f.name] for f in dataclasses.fields(settings) if f.name in taken}
  if clashes:
    raise ValueError(
        f'{settings.__name__} repeats fields declared already (field: declared in): {clashes}; '
        'rename them.'
    )
  _SETTINGS.append(settings)
  for field in dataclasses.fields(settings):
    extensions.note('setting', field.name, settings.__module__, settings.__name__)
  return settings


def kind_settings() -> tuple[type[KindSettings], ...]:
  """Every registered kind settings dataclass (`register_settings`), in registration order."""
  return tuple(_SETTINGS)


def settings_field(part: str) -> str:
  """The model field that holds the own settings of `part`'s chosen kind."""
  return f'{part}_settings'


def kind_settings_fields() -> dict[str, type[KindSettings]]:
  """Each field of a registered kind's settings -> the dataclass that declares it."""
  return {field.name: settings for settings in _SETTINGS for field in dataclasses.fields(settings)}


def part_fields() -> tuple[dataclasses.Field, ...]:
  """The backbone's parts and shared fields (`Parts`), then every registered kind settings'
  fields: what a config's `model` section offers besides the model's own fields."""
  return dataclasses.fields(Parts) + tuple(
      field for settings in _SETTINGS for field in dataclasses.fields(settings)
  )


for _settings in (T2TSettings, PositionalSettings, ReAttentionSettings, ClassAttentionSettings):
  register_settings(_settings)


# Model fields that say a part field's value in an earlier spelling, still accepted: the type a
# config holds, and the (part field, value) it spells (None: nothing).
FIELD_SPELLINGS: dict[str, tuple[type, Callable[[Any], tuple[str, Any] | None]]] = {
    'paper_layer_scale': (bool, lambda paper: ('layer_scale_init', 'paper') if paper else None),
}

"""The backbone's interchangeable parts and the settings every transformer family shares.

`Parts` declares them once, with ViT's defaults; `vit.VisionTransformer` (and so every family
preset of it) has them as fields, and the config schema (`vit_jax.config`) offers each as
`--config.model.FIELD`, unset until a user sets it (the registered model's own value). Declared
apart from the model, free of JAX, so that reading a config file imports neither.

- `stem`: 'patch' (ViT's patch embedding), 'cnn' (DeepViT's CNN stem), 't2t' (T2T-ViT's
  tokens-to-token module: `tokens_type` 'performer' or 'transformer', `token_dim`), or
  'space_to_depth' (SA-conv's); `vit_jax.models.stems`.
- `attention`: the attention kind of the main blocks, a name registered in
  `vit_jax.models.attention` ('standard', 'talking_heads', 're_attention' with
  `re_attention_norm`, Cordonnier et al.'s 'quadratic', 'gaussian', 'learned', 'learned_content',
  or your own: `attention.register`).
- `layer_scale_init`: CaiT's LayerScale: None (none), its initial value, or 'paper' (CaiT's
  depth rule, `layers.paper_layer_scale_init`).
- `class_stage`: 'token' (a class token from the first block) or 'class_attention' (CaiT's
  `class_attention_depth` class-attention blocks after the patch blocks).
- `distilled`: DeiT's distillation token and second head.
- `global_pool`: what the head reads: 'token', 'avg' or 'map'.
- `mlp_ratio`: the MLP width over the token width (the family's `default_mlp_ratio` when unset);
  a model gives its MLP width by `mlp_dim` or `mlp_ratio`, never both.
"""

import dataclasses


@dataclasses.dataclass(kw_only=True)
class Parts:
  """The backbone's parts and shared settings, with ViT's defaults (see the module docstring)."""

  stem: str = 'patch'
  tokens_type: str = 'performer'
  token_dim: int = 64
  attention: str = 'standard'
  re_attention_norm: str = 'batch'
  layer_scale_init: float | str | None = None
  class_stage: str = 'token'
  class_attention_depth: int = 2
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

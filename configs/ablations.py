r"""The seed papers' ablation grids as variants of one small backbone on the embedded digits.

Each grid is a set of variants of the shared backbone (`vit_jax.models.vit.VisionTransformer`),
which differ only in the parts under study; everything else (data, recipe, size) is the quick
default of configs/common.py. Run a grid, one training per variant, and print one table:

  python -m vit_jax.ablate --config=configs/ablations.py:grid=cait_layerscale --workdir=/tmp/abl

Grids and the published results they correspond to (ImageNet, full-size models; on the digits
the same comparison is made at toy scale, so expect the ordering at most, not the numbers):
- `cait_layerscale`: no LayerScale vs LayerScale (init 0.1, the paper's rule at this depth) vs
  the rule at its deeper settings (1e-5). CaiT Table 1: at depth 36 (DeiT-S width) LayerScale
  takes 80.7 -> 82.4 top-1 over no normalisation of the residual branches (the baseline diverges
  at depth 36 without it).
- `cait_talking_heads`: standard vs talking-heads attention in CaiT's blocks. CaiT Section 4.2 /
  Table 3: talking heads add +0.3 top-1 over CaiT without them.
- `cait_class_attention`: class token from the start vs CaiT's class-attention stage. CaiT
  Table 3: 79.9 -> 80.3 (the class-attention stage on top of LayerScale, S-24 trained 300 epochs
  without distillation).
- `deepvit_depth`: self-attention vs Re-attention at 4 and 8 blocks. DeepViT Table 4 / Figure 1:
  at 16/24/32 blocks ViT gives 78.9/79.4/79.1 top-1, DeepViT 79.1/80.1/80.9.
- `positional_in_vit`: SA-conv's positional attention (quadratic, learned, learned with content)
  in place of standard attention in a ViT whose class token joins after the blocks. Cordonnier et
  al. Table 1 (CIFAR-10, their 6-layer model): quadratic 93.8 %, learned 88.3 %, learned with
  content 89.9 %, against ResNet-18's 94.2 %.
- `t2t_stem`: patch embedding vs T2T's soft-split stem (Performer and transformer token
  attention) in front of the same ViT. T2T-ViT Table 1 / Section 4.4: T2T-ViT-14 81.5 % vs
  ViT-S/16 78.1 % at similar size (the T2T module accounts for most of the gain).
"""

import ml_collections

from configs import common

# Variant name -> model fields changed from the base backbone (`common.quick_model`).
_T2T_SPLITS_16 = ((3, 2, 1), (3, 2, 1), (3, 1, 1))  # 16 px -> 8 -> 4 -> 4: 16 tokens, stride 4.
GRIDS = {
    'cait_layerscale': {
        'no_layer_scale': {},
        'layer_scale_0.1': {'layer_scale_init': 0.1},
        'layer_scale_1e-5': {'layer_scale_init': 1e-5},
    },
    'cait_talking_heads': {
        'standard': {'layer_scale_init': 0.1, 'class_stage': 'class_attention'},
        'talking_heads': {'layer_scale_init': 0.1, 'class_stage': 'class_attention',
                          'attention': 'talking_heads'},
    },
    'cait_class_attention': {
        'class_token': {'layer_scale_init': 0.1, 'attention': 'talking_heads'},
        'class_attention': {'layer_scale_init': 0.1, 'attention': 'talking_heads',
                            'class_stage': 'class_attention'},
    },
    'deepvit_depth': {
        f'{kind}_{depth}': {'depth': depth, 'attention': kind}
        for depth in (4, 8) for kind in ('standard', 're_attention')
    },
    'positional_in_vit': {
        kind: {'attention': kind, 'class_stage': 'class_attention'}
        for kind in ('standard', 'quadratic', 'learned', 'learned_content')
    },
    't2t_stem': {
        'patch': {},
        't2t_performer': {'stem': 't2t', 'tokens_type': 'performer', 'token_dim': 32,
                          'soft_splits': _T2T_SPLITS_16},
        't2t_transformer': {'stem': 't2t', 'tokens_type': 'transformer', 'token_dim': 32,
                            'soft_splits': _T2T_SPLITS_16},
    },
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """`grid=NAME` (one of `GRIDS`): the quick digits run of a ViT and the grid's `variants`."""
  args = common.parse_arg(arg, grid='cait_layerscale')
  if args.grid not in GRIDS:
    raise ValueError(f'Unknown grid {args.grid!r}; valid: {list(GRIDS)}.')
  config = common.get_config()
  common.quick_run(config)
  common.quick_model(config.model, 'vit_ti4')
  config.model.init_scheme = 'timm'
  config.variants = ml_collections.ConfigDict(GRIDS[args.grid])
  return config

r"""The seed papers' ablation grids as variants of one small backbone on the embedded digits.

Each grid is a set of variants of the shared backbone (`vit_jax.models.vit.VisionTransformer`),
which differ only in the parts under study; everything else (data, recipe, size) is the quick
default of configs/common.py. Run a grid, one training per variant, and print one table:

  python -m vit_jax.ablate --config=configs/ablations.py:grid=cait_layerscale --workdir=/tmp/abl

Grids and the published results they correspond to (ImageNet or CIFAR-10, full-size models; on
the digits the same comparison runs at toy scale, so expect the ordering at most, not the numbers):
- `cait_layerscale`: no LayerScale vs LayerScale at ε = 0.1 (CaiT's rule up to 18 blocks) and at
  ε = 1e-5 (the rule's value at 24 blocks), at 4 and at 12 blocks. CaiT Section 2 and Table 1
  compare LayerScale with the other residual-branch weightings (Fixup, T-Fixup, ReZero) at 12 to
  36 blocks of DeiT-S width: Fixup and T-Fixup are competitive with it only at 12-18 blocks.
- `cait_talking_heads`: standard vs talking-heads attention in CaiT's blocks (CaiT Section 2).
- `cait_class_attention`: class token from the start vs CaiT's class-attention stage (CaiT
  Section 3 and Figure 3).
  The published pairs that differ by exactly these three parts (and depth) are the released
  distilled models (ImageNet, 224 px, hard distillation from RegNetY-16GF; the official README
  files, and timm's evaluation of the CaiT-XXS24 weights): DeiT-Ti 74.5 → CaiT-XXS24 78.4 at
  width 192, DeiT-S 81.2 → CaiT-S24 83.5 at width 384. DeiT has 12 blocks, no LayerScale,
  standard attention and a class token from the start; CaiT has 24 + 2 blocks with LayerScale
  1e-5, talking heads and two class-attention layers.
- `deepvit_depth`: self-attention vs Re-attention at 4, 8 and 16 blocks. DeepViT (official README
  of zhoudaquan/dvit_repo), top-1 / similar blocks: ViT-16B 78.88 / 5, DeepViT-16B 79.10 / 0;
  ViT-24B 79.35 / 11, DeepViT-24B 79.99 / 0; ViT-32B 79.27 / 15, DeepViT-32B 80.90 / 0.
- `positional_in_vit`: SA-conv's positional attention (quadratic, learned, learned with content)
  in place of standard attention in a ViT whose class token joins after the blocks. Cordonnier et
  al. Tables 1 and 4 (CIFAR-10, their 6-layer model): quadratic 93.8 %, learned 91.8 %, learned
  with content 87.1 %, against ResNet-18's 93.8 %.
- `t2t_stem`: patch embedding vs T2T's soft-split stem (Performer and transformer token
  attention) in front of the same ViT. T2T-ViT (official README): T2T-ViT-14 (Performer stem)
  81.5 %, T2T-ViT_t-14 (transformer stem) 81.7 %; the paper's Section 4 compares them with ViTs
  of similar size.

Commands, one per grid (each variant's run and the table's `ablation.json` under --workdir):

  python -m vit_jax.ablate --config=configs/ablations.py:grid=cait_layerscale --workdir=/tmp/ls
  python -m vit_jax.ablate --config=configs/ablations.py:grid=cait_talking_heads --workdir=/tmp/th
  python -m vit_jax.ablate --config=configs/ablations.py:grid=cait_class_attention --workdir=/tmp/ca
  python -m vit_jax.ablate --config=configs/ablations.py:grid=deepvit_depth --workdir=/tmp/dv
  python -m vit_jax.ablate --config=configs/ablations.py:grid=positional_in_vit --workdir=/tmp/pos
  python -m vit_jax.ablate --config=configs/ablations.py:grid=t2t_stem --workdir=/tmp/t2t

Test accuracy on the digits, mean ± standard deviation over 3 seeds (`--seeds=3
--config.batch_size=128 --config.total_steps=400 --config.warmup_steps=40`; 360 test images each):
- `cait_layerscale`, none / ε 0.1 / ε 1e-5: 0.957 ± 0.015 / 0.959 ± 0.014 / 0.932 ± 0.002 at 4
  blocks; 0.928 ± 0.031 / 0.974 ± 0.010 / 0.955 ± 0.009 at 12: LayerScale pays at depth.
- `cait_talking_heads`, standard / talking heads: 0.964 ± 0.017 / 0.952 ± 0.002 (no difference
  beyond the seeds').
- `cait_class_attention`, class token / class attention: 0.842 ± 0.044 / 0.952 ± 0.002.
- `deepvit_depth`, self-attention / Re-attention: 0.957 ± 0.015 / 0.912 ± 0.012 at 4 blocks,
  0.961 ± 0.010 / 0.892 ± 0.012 at 8, 0.939 ± 0.008 / 0.834 ± 0.061 at 16. Self-attention
  barely collapses at this size (a third of a similar block on average at 16), far from the 5 to
  15 similar blocks where DeepViT reports its gains; here Re-attention trails.
- `positional_in_vit`, standard / quadratic / learned / learned with content: 0.944 ± 0.026 /
  0.974 ± 0.007 / 0.969 ± 0.006 / 0.978 ± 0.011.
- `t2t_stem`, patch / Performer / transformer stem: 0.957 ± 0.015 / 0.973 ± 0.006 /
  0.980 ± 0.006.
"""

import ml_collections

from vit_jax.configs import common

# Variant name -> model fields changed from the base backbone (`common.quick_model`).
_T2T_SPLITS_16 = ((3, 2, 1), (3, 2, 1), (3, 1, 1))  # 16 px -> 8 -> 4 -> 4: 16 tokens, stride 4.
GRIDS = {
    'cait_layerscale': {
        f'{name}_d{depth}': {'depth': depth, **fields}
        for depth in (4, 12)
        for name, fields in (
            ('no_layer_scale', {}),
            ('layer_scale_1e-1', {'layer_scale_init': 0.1}),
            ('layer_scale_1e-5', {'layer_scale_init': 1e-5}),
        )
    },
    'cait_talking_heads': {
        'standard': {'layer_scale_init': 0.1, 'class_stage': 'class_attention'},
        'talking_heads': {
            'layer_scale_init': 0.1,
            'class_stage': 'class_attention',
            'attention': 'talking_heads',
        },
    },
    'cait_class_attention': {
        'class_token': {'layer_scale_init': 0.1, 'attention': 'talking_heads'},
        'class_attention': {
            'layer_scale_init': 0.1,
            'attention': 'talking_heads',
            'class_stage': 'class_attention',
        },
    },
    'deepvit_depth': {
        f'{kind}_{depth}': {'depth': depth, 'attention': kind}
        for depth in (4, 8, 16)
        for kind in ('standard', 're_attention')
    },
    'positional_in_vit': {
        kind: {'attention': kind, 'class_stage': 'class_attention'}
        for kind in ('standard', 'quadratic', 'learned', 'learned_content')
    },
    't2t_stem': {
        'patch': {},
        't2t_performer': {
            'stem': 't2t',
            'tokens_type': 'performer',
            'token_dim': 32,
            'soft_splits': _T2T_SPLITS_16,
        },
        't2t_transformer': {
            'stem': 't2t',
            'tokens_type': 'transformer',
            'token_dim': 32,
            'soft_splits': _T2T_SPLITS_16,
        },
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

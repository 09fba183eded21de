"""Looking inside attention: maps, collapse, rollout, distances, SA-conv centres and pruning.

Every analysis reads the attention probabilities that each attention module sows to
`intermediates` (`maps.attention_maps`), so any registered model can be analysed without a second
model definition. `theorem.conv_to_attention` turns a convolution into an SA-conv attention layer.
`report.analyze` runs them on a trained run (`python -m vit_jax.analyze --workdir=W`);
`ablation.run_grid` trains, measures and tabulates a grid of variants (`python -m vit_jax.ablate`).
"""

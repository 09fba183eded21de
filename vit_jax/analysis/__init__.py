"""Looking inside attention: maps, collapse, rollout, distances, SA-conv centres and pruning.

Every analysis reads the attention probabilities that each attention module sows to
`intermediates` (`maps.attention_maps`), so any registered model can be analysed without a second
model definition. `theorem.conv_to_attention` turns a convolution into an SA-conv attention layer.
The command line is `python -m vit_jax.analyze --workdir=W`.
"""

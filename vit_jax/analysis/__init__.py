"""Looking inside attention: maps, collapse, rollout, distances, SA-conv centres and pruning.

Every analysis reads the attention probabilities each attention module sows
(`maps.attention_maps`), so any registered model can be analysed; `report.analyze` runs them on a
trained run, `ablation.run_grid` on a grid of variants.
"""

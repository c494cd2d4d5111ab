"""The baselines' layouts: Megatron-LM's symmetric DP x TP x PP (:mod:`.symmetric`)."""

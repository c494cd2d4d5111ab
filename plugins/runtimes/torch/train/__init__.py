"""One rank's training: :mod:`.trainer` (the loop, its worker spec and state), :mod:`.lr_schedule`
(per-step learning rate and clipping), :mod:`.data_source` (token batches: synthetic, text, token
files).
"""

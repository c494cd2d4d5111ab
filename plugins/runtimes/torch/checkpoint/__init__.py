"""Checkpoints: :mod:`.native` (pickle-free resumable checkpoints and ``final/``), :mod:`.sharded`
(ZeRO pieces gathered into and restored from them), :mod:`.hugging_face` (safetensors slices in,
Hugging Face directories out).
"""

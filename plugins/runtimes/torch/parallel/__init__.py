"""Parallelisms of the torch runtime, one module or folder each: :mod:`.assignment` (every
pipeline of a run: ranks, stage groups, chunk layers, action lists; no torch), :mod:`.layout` (this
rank's parallel layout), :mod:`.tensor` (Megatron tensor parallelism), :mod:`.pipeline` (the
executor of action lists), :mod:`.tied_embedding` (the embedding group), :mod:`.data` (data
parallelism: gradient sync, ZeRO, hybrid sharding, the global gradient norm).
"""

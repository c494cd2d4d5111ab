"""Data parallelism: :mod:`.sync` (asymmetric chunked all-reduce among the holders of a chunk),
:mod:`.zero_state` (ZeRO-1/2/3 over those chunk groups), :mod:`.hybrid` (sharding inside a machine,
summing across machines), :mod:`.grad_norm` (the global gradient norm and clipping).
"""

"""Measuring: :mod:`.profiler` (``hexicore profile``: one job per device), :mod:`.samplers` (its timed
blocks, heads, messages and all-reduces), :mod:`.measure` (what a training run measures of its
steps for ``metrics.json``).
"""

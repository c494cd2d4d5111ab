"""The data of hexicore: clusters (:mod:`~hexicore.core.cluster`, with the GPU catalog in
:mod:`~hexicore.core.gpus`, a plan's ``devices`` list in :mod:`~hexicore.core.device_list` and
the ``synthetic`` cluster form in :mod:`~hexicore.core.fleet`), model specs
(:mod:`~hexicore.core.model`), plans and their JSON (:mod:`~hexicore.core.plan`), estimates
(:mod:`~hexicore.core.estimate`), schedule references (:mod:`~hexicore.core.schedule_ref`), the
run a runtime receives (:mod:`~hexicore.core.run_spec`), file
readers and writers (:mod:`~hexicore.core.schema`) and errors (:mod:`~hexicore.core.errors`).

Frozen dataclasses and pure parsing only: no search, no pricing, no I/O beyond reading and
writing the project's files. May import: the standard library, numpy, PyYAML — nothing else of
hexicore.
"""

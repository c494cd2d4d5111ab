"""The model a rank runs: :mod:`.llama` (Llama chunks, tensor-parallel) and :mod:`.stage_module`
(the stage chunks of one rank, built and initialised from the seed, a checkpoint or Hugging Face
weights).
"""

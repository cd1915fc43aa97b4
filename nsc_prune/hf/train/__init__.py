"""Recovery training of pruned checkpoints: data (``data``), the recipe (``recipe``), the losses (``losses``), the
trainer (``trainer``, built on ``transformers.Trainer``) and healing one extracted checkpoint (``heal``).

Import the submodules directly; this package imports nothing heavy on its own.
"""

"""Everything that touches weights, one sub-package per job of the pipeline:

- ``weights/``: reading weights (safetensors, the base model check, adapters, loading, layer streaming, GGUF source);
- ``score/``: the DP's values from weights (psi_W, the measured sensitivity table);
- ``cut/``: which channels to keep and the tensor engine that cuts them;
- ``export/``: one module per output format; ``extract.py`` is the entry point over cut and export;
- ``train/``: recovery (healing a checkpoint, the LoRA super-adapter);
- ``latency/``: latency profiling for the DP's latency cost;
- ``modeling/``: the modeling files shipped in pruned checkpoints.

torch is imported by these modules, never by ``core``, ``spaces`` or ``plan``."""

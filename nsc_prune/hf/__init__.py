"""Everything that touches weights: safetensors I/O, the base-model check (``base``), kept index sets (``keep``),
channel selection, extraction, loading, psi_W, the SmolLM2 GGUF source, and the modeling file shipped in
pruned checkpoints. torch is imported by these modules, never by ``core``, ``spaces`` or ``plan``."""

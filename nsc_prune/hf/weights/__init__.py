"""Reading weights: safetensors I/O (no unpickling), the base model and its one config-vs-weights check, LoRA
adapters, loading pruned checkpoints, streaming a base one decoder layer at a time, and a GGUF source converted
into a safetensors folder."""

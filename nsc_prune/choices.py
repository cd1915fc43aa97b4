"""Every fixed list of choices, in one torch-free module that the library and the CLI both read.

A library dataclass validates against these tuples and the CLI offers them as ``choices=``, so a new format,
dtype or selection method is one edit here (plus the code that implements it).
"""

from __future__ import annotations

FORMATS = ("pruned", "padded", "nemotron-nas", "gguf")  # extract --format (writers: nsc_prune.hf.export.EXPORTS)
OWN_FORMATS = ("pruned", "padded")  # the formats that can carry a sliced adapter (--keep-adapter)
CHECKPOINT_DTYPES = ("float32", "float16", "bfloat16")  # extract --dtype: a checkpoint's float dtype
GGUF_TYPES = ("f16", "bf16", "f32", "q8_0")  # extract --outtype (gguf): tensor type of the 2-D weights
SELECTIONS = ("first", "magnitude", "activation")  # which channels a cut keeps (nsc_prune.hf.cut.selection)
TRAIN_SELECTIONS = ("magnitude", "activation")  # train-supernet: "first" would be no ranking at all
SCORES = ("psi_mp", "psi_w", "measured")  # the DP's values (search --score); pareto.json score.backend
SENSITIVITY_TARGETS = ("loss", "kl")  # --sensitivity-target: loss increase on the text's labels, or KL from dense
SCORE_ALIASES = {"mp": "psi_mp", "svd": "psi_w"}  # spellings of nsc-prune 0.1, accepted with a warning
COST_KINDS = ("params", "macs", "latency")  # what a plan's cost counts (pareto.json cost.kind)
PHASES = ("decode", "prefill")  # what a latency table times: one generated token, or a prompt's forward pass
LATENCY_BACKENDS = ("transformers", "llama.cpp")  # profile --backend (llama.cpp: llama-cpp-python, on the CPU)
DEVICES = ("cpu", "cuda")
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")  # --calib-dtype: a streamed base's layers (float16: GPU only)
PROFILE_DTYPES = ("float32", "bfloat16", "float16", "q8_0")  # profile --dtype (q8_0: llama.cpp only)
GGUF_TYPE_OF = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "q8_0": "q8_0"}  # profile --dtype -> GGUF
EVAL_DTYPES = ("auto", "float32", "bfloat16", "float16")  # eval --dtype (auto: bf16 on GPU, fp32 on CPU)
EVAL_BACKENDS = ("hf", "vllm")  # eval --backend
AUTO_SWITCH = ("auto", "true", "false")  # --bf16, --gradient-checkpointing

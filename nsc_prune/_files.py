"""File names, bundled folders and the cache folder: the one place they live.

Torch-free, so every part can import it.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
CONFIG_DIR = PACKAGE_DIR / "configs"
PRESETS_DIR = CONFIG_DIR / "models"
SPACES_DIR = CONFIG_DIR / "spaces"

# The search's outputs.
PARETO_FILE = "pareto.json"
PLOT_FILE = "pareto.png"

# Hugging Face checkpoint and PEFT adapter files.
CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
SHARD_PATTERN = "model-{index:05d}-of-{count:05d}.safetensors"
ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)
TOKENIZER_DIRS = ("additional_chat_templates",)  # transformers 5 saves each named chat template there as NAME.jinja
# A folder holding one of these has a tokenizer transformers can load (the rest only complete it).
TOKENIZER_CORE_FILES = TOKENIZER_FILES[:3]

# What extraction writes beside a pruned checkpoint.
RECORD_NAME = "nsc_prune_extract.json"  # plan, options, provenance
ADAPTER_DIR = "adapter"  # the sliced PEFT adapter of --keep-adapter

# What train-supernet writes beside a PEFT super-adapter.
CHANNEL_ORDER_NAME = "nsc_prune_channel_order.json"  # per-layer FFN / KV-group orders extraction applies
SUPERNET_RECORD_NAME = "nsc_prune_supernet.json"  # space, sampling rule, recipe, data, provenance

# What `nsc-prune models --prepare` writes last into a converted model folder (its presence means complete).
SOURCE_RECORD_NAME = "nsc_prune_source.json"  # the GGUF file converted, its sha256, provenance

CACHE_ENV = "NSC_PRUNE_CACHE"


def has_tokenizer(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a tokenizer (one of ``TOKENIZER_CORE_FILES``)."""
    return any((Path(folder) / name).is_file() for name in TOKENIZER_CORE_FILES)


def cache_dir(*parts: str) -> Path:
    """``$NSC_PRUNE_CACHE`` (an empty value counts as unset; a leading ``~`` expanded, as HF_HOME's; a relative
    path made absolute, as records name it), else ``~/.cache/nsc-prune``; ``parts`` joined below it."""
    root = os.environ.get(CACHE_ENV)
    return (user_path(root).absolute() if root else Path.home() / ".cache" / "nsc-prune").joinpath(*parts)


def user_path(text: str | os.PathLike) -> Path:
    """``text`` with a leading ``~`` or ``~user`` expanded; left as written when that user has no home (pathlib
    raises RuntimeError), so the caller's "does not exist" names it."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        return Path(text)

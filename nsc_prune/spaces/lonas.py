"""LoNAS supernet adapter (Munoz et al. 2024; paper section 4.3, appendix F).

Per block: LoRA rank ``{r, r-4}`` (one rank tied across q/k/v and gate/up; down_proj LoRA fixed
at ``r``; no LoRA on o_proj) x FFN width ``{100, 87.5, 75, 62.5, 50}%`` of the base width. Subnets
keep the FIRST k channels and first ranks; LoRA scaling stays ``alpha / r``. The same space
applies to any LLaMA-family config; on a model with fused projections (Phi-3: ``qkv_proj``, ``gate_up_proj``) the
LoRA of q/k/v and of gate/up is the fused module's, as PEFT puts it there.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsc_prune._files import ADAPTER_CONFIG_NAME, SUPERNET_RECORD_NAME
from nsc_prune._io import read_json_object
from nsc_prune._validation import is_int, is_number, must_be, name_list
from nsc_prune.core.front import LORA_PARAMS, SearchSpace, Subspace
from nsc_prune.core.layer_plan import LayerPlan
from nsc_prune.core.spec import (
    FUSED,
    FUSED_LORA_MODULES,
    LORA_MODULES,
    DecoderDims,
    DecoderLayerChoice,
    LayerOption,
    decoder_dims,
    decoder_fixed_option,
    decoder_layer_option,
    layer_dims,
    layer_lora_targets,
    lora_module_names,
    projection_shapes,
)
from nsc_prune.errors import ConfigError, InvalidInputError
from nsc_prune.spaces.registry import register_space_kind

PEFT_LORA_ALPHA = 8  # peft.LoraConfig's lora_alpha when adapter_config.json leaves it out
KNOWN_MODULES = (*LORA_MODULES, *FUSED_LORA_MODULES)  # LLaMA's projections, and Phi-3's fused ones
_ELASTIC_DEFAULT = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


@dataclass(frozen=True)
class LonasSpaceConfig:
    """The LoNAS elastic space. YAML keys equal these field names."""

    ffn_fractions: tuple[float, ...] = (1.0, 0.875, 0.75, 0.625, 0.5)  # of the base FFN width
    lora_rank: int = 32  # r_max of the super-adapter
    lora_alpha: float = 64.0  # recorded for extraction: scaling alpha / r_max
    rank_deltas: tuple[int, ...] = (0, -4)  # elastic ranks r + delta
    elastic_rank_modules: tuple[str, ...] = _ELASTIC_DEFAULT  # the fused module's on Phi-3
    fixed_rank_modules: tuple[str, ...] = ("down_proj",)  # LoRA kept at r_max
    init: str | float = "xavier"  # paper: Xavier for every matrix in the LoNAS search

    def __post_init__(self) -> None:
        for name, example in (("ffn_fractions", "[1.0, 0.75]"), ("rank_deltas", "[0, -4]")):
            if not isinstance(getattr(self, name), (list, tuple)):
                raise ConfigError(f"{name} must be a list, e.g. {example}; got {getattr(self, name)!r}")
        if not is_int(self.lora_rank):
            raise ConfigError(f"lora_rank must be a whole number >= 0; got {self.lora_rank!r}")
        if not all(is_int(d) for d in self.rank_deltas):
            raise ConfigError(f"rank_deltas must be whole numbers; got {self.rank_deltas!r}")
        if not all(is_number(f) for f in self.ffn_fractions):
            raise ConfigError(f"ffn_fractions must be numbers in (0, 1]; got {self.ffn_fractions!r}")
        object.__setattr__(self, "ffn_fractions", tuple(float(f) for f in self.ffn_fractions))
        object.__setattr__(self, "rank_deltas", tuple(self.rank_deltas))
        for name in ("elastic_rank_modules", "fixed_rank_modules"):
            object.__setattr__(self, name, name_list(getattr(self, name), name, allow_empty=True))
        if not self.ffn_fractions or any(not 0 < f <= 1 for f in self.ffn_fractions):
            raise ConfigError(f"ffn_fractions must be non-empty, each in (0, 1]; got {list(self.ffn_fractions)}")
        if self.lora_rank < 0 or any(self.lora_rank + d <= 0 for d in self.rank_deltas if self.lora_rank):
            raise ConfigError(
                f"lora_rank + each of rank_deltas must be > 0; got r={self.lora_rank}, deltas={list(self.rank_deltas)}"
            )
        if not self.rank_deltas or any(d > 0 for d in self.rank_deltas):  # a rank above r_max has no adapter weights
            raise ConfigError(
                f"rank_deltas must be non-empty, each <= 0 (ranks up to lora_rank); got {self.rank_deltas!r}"
            )
        if not (is_number(self.lora_alpha) and 0 < self.lora_alpha < math.inf):
            raise ConfigError(f"lora_alpha must be a positive finite number; got {self.lora_alpha!r}")
        _check_known(self.elastic_rank_modules + self.fixed_rank_modules)
        if self.lora_rank and not self.elastic_rank_modules + self.fixed_rank_modules:
            raise ConfigError(
                "elastic_rank_modules and fixed_rank_modules are both empty: no projection gets the LoRA rank "
                f"{self.lora_rank}; for FFN widths alone pass lora_rank=0"
            )


def _check_known(modules: tuple[str, ...]) -> None:
    unknown = sorted(set(modules) - set(KNOWN_MODULES))
    if unknown:
        raise ConfigError(
            f"LoRA modules {unknown} are not decoder projections (LLaMA's {', '.join(LORA_MODULES)}; Phi-3's "
            f"fused {', '.join(FUSED_LORA_MODULES)})"
        )


def _modules_of(config: LonasSpaceConfig, model_type: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The elastic- and fixed-rank modules as a ``model_type`` layer names them (``layer_lora_targets``). ConfigError
    for a module the layer lacks (``qkv_proj`` on LLaMA), and for one given both kinds of rank, itself or through
    the parts of a fused module (``q_proj`` elastic and ``v_proj`` fixed on Phi-3)."""
    elastic, lacked = layer_lora_targets(config.elastic_rank_modules, model_type)
    fixed, lacked_fixed = layer_lora_targets(config.fixed_rank_modules, model_type)
    if lacked or lacked_fixed:
        raise ConfigError(
            f"LoRA modules {sorted({*lacked, *lacked_fixed})} do not exist in a {model_type} layer (its projections: "
            f"{', '.join(lora_module_names(model_type))})"
        )
    both = sorted(set(elastic) & set(fixed))
    if both:
        listed_twice = set(both) <= set(config.elastic_rank_modules) & set(config.fixed_rank_modules)
        why = "" if listed_twice else f" (a {model_type} layer holds their parts in one module)"
        raise ConfigError(
            f"LoRA modules {both} would have both an elastic and a fixed rank{why}: list each in one of "
            f"elastic_rank_modules ({list(config.elastic_rank_modules)}) and fixed_rank_modules "
            f"({list(config.fixed_rank_modules)})"
        )
    return elastic, fixed


def _narrowest_side(dims: DecoderDims, ffn: int, modules: Sequence[str]) -> int:
    """The smallest side of the projections ``modules`` (a layer's names, fused ones included) at FFN width ``ffn``:
    a LoRA rank above it adapts no more than that side. Only the adapted ones count (a q/o adapter of rank 48 fits
    a model whose k/v are 32 wide)."""
    shapes = projection_shapes(dims.hidden_size, dims.head_dim, dims.num_attention_heads, dims.num_key_value_heads, ffn)
    for module, parts in FUSED.items():
        shapes[module] = (sum(shapes[part][0] for part in parts), shapes[parts[0]][1])
    by_name = {path.rsplit(".", 1)[-1]: shape for path, shape in shapes.items()}
    return min(min(by_name[module]) for module in modules)


def _check_rank_fits(config: LonasSpaceConfig, per_layer: Sequence[DecoderDims], adapted: Sequence[str]) -> None:
    """ConfigError unless every adapted matrix of every layer, at the narrowest FFN fraction, is at least the LoRA
    rank wide."""
    lowest = min(config.ffn_fractions)
    narrowest = min(_narrowest_side(d, round(lowest * d.intermediate_size), adapted) for d in per_layer)
    if config.lora_rank <= narrowest:
        return
    whole = min(_narrowest_side(d, d.intermediate_size, adapted) for d in per_layer)
    if config.lora_rank <= whole:  # the model takes the adapter; the narrowest FFN fraction does not
        smallest_ffn = min(d.intermediate_size for d in per_layer)
        raise ConfigError(
            f"ffn_fractions {list(config.ffn_fractions)}: {lowest} leaves an adapted matrix {narrowest} wide, "
            f"narrower than the adapter's LoRA rank {config.lora_rank}; raise the smallest fraction to at least "
            f"{math.ceil(config.lora_rank / smallest_ffn * 1000) / 1000}"
        )
    raise ConfigError(
        f"LoRA rank {config.lora_rank} is larger than the narrowest adapted matrix of this model ({whole}); "
        "is the adapter made for another base model?"
    )


def build_lonas_space(config: LonasSpaceConfig, model_config: Mapping[str, Any] | None) -> SearchSpace:
    """The LoNAS space of a decoder: per layer, the FFN fractions times the LoRA ranks of the super-adapter (its
    ``rank_deltas`` below ``lora_rank``), costed as the model after LoRA is merged."""
    if model_config is None:
        raise ConfigError("the lonas space needs a model: pass --model")
    dims = decoder_dims(model_config)
    elastic, fixed = _modules_of(config, model_config.get("model_type"))
    per_layer = layer_dims(model_config)  # a pruned checkpoint's per-layer widths and heads are each layer's full size
    smallest_ffn = min(d.intermediate_size for d in per_layer)
    if round(min(config.ffn_fractions) * smallest_ffn) < 1:
        raise ConfigError(
            f"ffn_fractions {list(config.ffn_fractions)}: {min(config.ffn_fractions)} of an FFN of {smallest_ffn} "
            "channels keeps none; use larger fractions (a layer that keeps no FFN is a depth choice, not a LoNAS one)"
        )
    if config.lora_rank:  # with no LoRA (rank 0) the module lists are not read
        _check_rank_fits(config, per_layer, (*elastic, *fixed))
    ranks = sorted({config.lora_rank + d for d in config.rank_deltas}, reverse=True) if config.lora_rank else [0]
    lora_by_rank = {rank: {m: rank for m in elastic} | {m: config.lora_rank for m in fixed} for rank in ranks}

    @functools.cache
    def table(layer: DecoderDims) -> tuple[LayerOption, ...]:
        widths = sorted({round(f * layer.intermediate_size) for f in config.ffn_fractions}, reverse=True)
        return tuple(
            decoder_layer_option(
                layer,
                DecoderLayerChoice(ffn=width, kv_heads=layer.num_key_value_heads, lora=lora_by_rank[rank]),
                config.init,
                LayerPlan(ffn=width, lora_rank=rank),
            )
            for width in widths
            for rank in ranks
        )

    layers = tuple(table(layer) for layer in per_layer)
    full_widths = sorted({d.intermediate_size for d in per_layer}, reverse=True)
    ffn = (
        f"FFN {sorted({round(f * full_widths[0]) for f in config.ffn_fractions}, reverse=True)}"
        if len(full_widths) == 1
        else f"FFN {[f'{f:g}' for f in sorted(set(config.ffn_fractions), reverse=True)]} of each layer's width "
        f"({full_widths[-1]}..{full_widths[0]})"
    )
    return SearchSpace(
        name="lonas",
        subspaces=(Subspace(choice={}, fixed=decoder_fixed_option(dims), layers=layers),),
        description=f"LoNAS: {ffn} x LoRA rank {ranks} per block",
        params_convention=LORA_PARAMS,
    )


def comparable(key: str, value: Any) -> Any:
    """A lonas setting in one form, to compare two sources of it (a --set and an adapter, a front and a space):
    module lists as sorted tuples (their order means nothing), other lists as tuples, numbers as floats."""
    if key.endswith("_modules"):
        return tuple(sorted(name_list(value, key, allow_empty=True)))
    if isinstance(value, list | tuple):
        return tuple(value)
    return float(value) if is_number(value) else value


def fixed_rank_modules(space: Mapping[str, Any], model_type: str | None) -> dict[str, int]:
    """Projection -> the LoRA rank every plan of a lonas space keeps there: its ``fixed_rank_modules`` at its
    ``lora_rank``, as its options were scored (named as a ``model_type`` layer names them too: Phi-3's
    ``gate_up_proj`` for gate/up); empty for any other space. ``space``: a space's settings, or pareto.json's."""
    if space.get("kind") != "lonas":
        return {}
    given = space.get("fixed_rank_modules", LonasSpaceConfig.fixed_rank_modules)  # absent: the space's default
    names = name_list(given, "the lonas space's fixed_rank_modules", allow_empty=True)
    if not names:
        return {}
    _check_known(names)  # a hand-edited pareto.json's typo would cut that projection at the plan's rank
    rank = space.get("lora_rank", LonasSpaceConfig.lora_rank)
    if not (is_int(rank) and rank >= 0):
        raise ConfigError(must_be("the lonas space's lora_rank", "an integer >= 0", rank))
    return {name: rank for name in (*names, *layer_lora_targets(names, model_type)[0])}


# adapter_config.json settings whose effect a merged or sliced adapter cannot reproduce.
_UNSUPPORTED = {
    "use_dora": "DoRA (use_dora=true)",
    "modules_to_save": "fully trained extra modules (modules_to_save)",
    "lora_bias": "LoRA biases (lora_bias=true)",
    "target_parameters": "parameter targeting (target_parameters)",
    "trainable_token_indices": "trainable tokens (trainable_token_indices)",
    "layer_replication": "layer replication",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "fan_in_fan_out": "fan_in_fan_out=true",
}


def read_lora_config(adapter_dir: str | Path) -> dict[str, Any]:
    """Read and check a PEFT LoRA ``adapter_config.json`` (the one reader, for the search and for extraction):
    a LoRA config with a positive integer ``r``, a positive ``lora_alpha`` (PEFT's 8 when left out), its
    ``target_modules``, and nothing that slicing and merging cannot reproduce (DoRA, LoRA biases, extra trained
    modules, ...)."""
    folder = Path(adapter_dir)
    if not folder.is_dir():
        raise InvalidInputError(must_be("adapter", "a PEFT adapter folder", str(folder)))
    path = folder / ADAPTER_CONFIG_NAME
    if not path.is_file():
        raise InvalidInputError(
            f"adapter folder {folder} has no {ADAPTER_CONFIG_NAME}; --adapter takes a PEFT LoRA adapter folder"
        )
    data = read_json_object(path)
    if str(data.get("peft_type", "LORA")).upper() != "LORA" or "r" not in data:
        raise ConfigError(f"{path} is not a LoRA adapter config (peft_type={data.get('peft_type')!r})")
    rank, alpha = data["r"], data.get("lora_alpha", PEFT_LORA_ALPHA)
    if not is_int(rank) or rank <= 0:
        raise ConfigError(f"{path}: r must be a positive integer; got {rank!r}")
    if not (is_number(alpha) and 0 < alpha < math.inf):
        raise ConfigError(f"{path}: lora_alpha must be a positive finite number; got {alpha!r}")
    for key, valid, what in (
        ("rank_pattern", lambda v: is_int(v) and v > 0, "a positive integer"),
        ("alpha_pattern", lambda v: is_number(v) and 0 < v < math.inf, "a positive finite number"),
    ):
        patterns = data.get(key) or {}
        if not isinstance(patterns, dict):
            raise ConfigError(f"{path}: {key} must be an object (module pattern -> value); got {patterns!r}")
        bad = next(((k, v) for k, v in patterns.items() if not valid(v)), None)
        if bad is not None:
            raise ConfigError(f"{path}: {key}[{bad[0]!r}] must be {what}; got {bad[1]!r}")
    if data.get("target_modules") in (None, [], ""):  # PEFT then adapts its own default for the model type
        raise ConfigError(
            f"{path} names no target_modules: PEFT would adapt its default modules for the model type (q_proj and "
            "v_proj for llama), not every module the weights hold; list the modules the adapter was trained on"
        )
    for key, what in _UNSUPPORTED.items():
        if data.get(key):
            raise ConfigError(f"{path} uses {what}, which nsc-prune cannot slice; retrain without it")
    if data.get("bias", "none") != "none":
        raise ConfigError(f"{path}: bias={data['bias']!r} is not supported; only bias='none'")
    return data


def trained_space_settings(adapter_dir: str | Path, lora_rank: int) -> dict[str, Any]:
    """The lonas space settings a super-adapter of rank ``lora_rank`` was trained on (``nsc-prune train-supernet``'s
    record beside it: its FFN fractions and rank deltas, say), less its kind and its r; empty for an adapter without
    that record, or one trained on another kind of space. Rank deltas are made relative to ``lora_rank``, so the
    ranks are the trained ones (a space trained at r 32 in an adapter of r 64 had ranks 32 + deltas)."""
    path = Path(adapter_dir) / SUPERNET_RECORD_NAME
    if not path.is_file():
        return {}
    space = read_json_object(path, unique_keys=True).get("space")
    settings = space.get("settings") if isinstance(space, Mapping) else None
    if not isinstance(settings, Mapping):
        raise ConfigError(f"{path} must hold the space it was trained on ('space': {{'settings': {{...}}}})")
    if settings.get("kind") != "lonas":
        return {}
    trained = {k: v for k, v in settings.items() if k not in ("kind", "lora_rank")}
    nulls = sorted(k for k, v in trained.items() if v is None)  # would be read as "not set": the default
    rank, deltas = settings.get("lora_rank", lora_rank), trained.get("rank_deltas")
    if nulls or not (is_int(rank) and rank >= 1):
        got = f"null {', '.join(nulls)}" if nulls else f"lora_rank {rank!r}"
        raise ConfigError(f"{path} must hold the lonas settings it was trained on; got {got}")
    if isinstance(deltas, list) and all(is_int(d) for d in deltas):
        trained["rank_deltas"] = [rank + d - lora_rank for d in deltas]
    return trained


def read_adapter_config(adapter_dir: str | Path, model_type: str | None = None) -> dict[str, Any]:
    """``LonasSpaceConfig`` overrides from a PEFT ``adapter_config.json``: r, lora_alpha and which modules
    have elastic and fixed ranks. ``model_type``: the base the adapter is used with; ConfigError, naming the
    file, when it targets a module that model's layers lack (an adapter made for another family)."""
    data = read_lora_config(adapter_dir)
    path = Path(adapter_dir) / ADAPTER_CONFIG_NAME
    if data.get("rank_pattern"):
        raise ConfigError(
            f"{path}: per-module ranks (rank_pattern) do not fit the lonas space, which has one r per block"
        )
    some = [key for key in ("layers_to_transform", "exclude_modules") if data.get(key) not in (None, [], "")]
    if some:  # the space counts and keeps LoRA in every layer; extraction then refused the layers without any
        raise ConfigError(
            f"{path}: {' and '.join(some)} leave some layers or modules without LoRA, and the lonas space has one r "
            "per block in every layer; search the base without --adapter, or train an adapter of every layer"
        )
    targets = data["target_modules"]  # read_lora_config: some
    if targets == "all-linear":
        targets = list(LORA_MODULES)  # on Phi-3 the space names their fused modules
    elif isinstance(targets, str):
        raise ConfigError(f"{path}: target_modules is a regex ({targets!r}); list the module names instead")
    if not isinstance(targets, list) or not all(isinstance(m, str) for m in targets):
        raise ConfigError(f"{path}: target_modules must be a list of module names or 'all-linear'; got {targets!r}")
    unknown = sorted(set(targets) - set(KNOWN_MODULES))
    if unknown:
        raise ConfigError(
            f"{path}: target_modules {unknown} do not exist in a LLaMA-family model ({', '.join(KNOWN_MODULES)})"
        )
    foreign = layer_lora_targets(targets, model_type)[1]
    if model_type is not None and foreign:
        raise ConfigError(
            f"{path}: target_modules {foreign} are not projections of a {model_type} layer "
            f"({', '.join(lora_module_names(model_type))}); is the adapter made for another base model?"
        )
    elastic = (*_ELASTIC_DEFAULT, *FUSED_LORA_MODULES)  # a fused module's rank is its parts'
    return {
        "lora_rank": data["r"],
        "lora_alpha": float(data.get("lora_alpha", PEFT_LORA_ALPHA)),
        "elastic_rank_modules": tuple(m for m in elastic if m in targets),
        "fixed_rank_modules": tuple(m for m in targets if m not in elastic),
    }


register_space_kind("lonas", LonasSpaceConfig, build_lonas_space)

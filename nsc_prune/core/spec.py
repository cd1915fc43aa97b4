"""Architecture specs: which weight matrices a layer has, and what they cost (paper section 3.3).

A layer option is a tuple of ``Matrix(rows, cols, std, count)``; its value is the summed
``psi_mp`` of its matrices, its costs are exact integer parameter and multiply-accumulate counts.
Embeddings, norms and biases are not scored but are counted as parameters (``extra_params``).

This module holds the LLaMA-family decoder builder: Q per head, K and V per KV head (GQA/MQA), one O, gated
gate/up/down, optional LoRA A (r x in) and B (out x r). Its model types are llama, mistral, qwen2, qwen3, granite,
smollm3, olmo2, phi3, gemma2, gemma3_text (search and every weights job; olmo2 without KV-group cuts) and, for the
search only, the multimodal gemma3 wrapper (its text model is counted). Their counts are the Hugging Face modules'
(extra norms, q/k norms, tied embeddings); what a search-only type lacks for the weights jobs is
``search_only_reason``. Other families live in ``nsc_prune.ranking.families``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nsc_prune._validation import is_int, is_number, must_be
from nsc_prune.core.capacity import init_std, psi_mp
from nsc_prune.core.layer_plan import LayerPlan
from nsc_prune.errors import ConfigError, InvalidInputError, UnsupportedArchitectureError


@dataclass(frozen=True)
class Matrix:
    """``count`` weight matrices of shape ``rows x cols`` (out x in) with init std ``std``.

    ``lora`` marks adapter factors: scored and multiplied (MACs) but merged into the base weight
    when deployed, so they add no parameters.
    """

    rows: int
    cols: int
    std: float
    count: int = 1
    name: str = ""
    lora: bool = False

    @property
    def params(self) -> int:
        return 0 if self.lora else self.rows * self.cols * self.count

    @property
    def macs(self) -> int:
        """Multiply-accumulates per token (one matrix-vector product per matrix)."""
        return self.rows * self.cols * self.count


@dataclass(frozen=True)
class LayerOption:
    """One choice for one layer: its label, its matrices, and parameters that are counted but not scored (norms,
    biases, embeddings). A decoder layer's label is a ``LayerPlan`` (``LayerPlan(ffn=8256, lora_rank=32)``); the
    NAS families' and the fixed parts' are dicts (``{"num_heads": 8, "mlp_ratio": 4.0}``)."""

    label: Mapping[str, Any]
    matrices: tuple[Matrix, ...]
    extra_params: int = 0
    extra_macs: int = 0
    capacity: float | None = None  # Psi_l when the caller scored many options in one vectorised call

    @functools.cached_property
    def nsc(self) -> float:
        """Summed capacity ``Psi_l = sum_j count_j * psi_mp(m_j, n_j, s_j)`` (Eq. 6)."""
        if self.capacity is not None:
            return self.capacity
        count, psi = self._capacities
        return float(np.sum(count * psi))

    @functools.cached_property
    def _capacities(self) -> tuple[np.ndarray, np.ndarray]:
        """``(count_j, psi_mp(m_j, n_j, s_j))`` per scored matrix (``capacity`` once when it is given)."""
        if self.capacity is not None:
            return np.ones(1), np.array([self.capacity])
        if not self.matrices:
            return np.zeros(0), np.zeros(0)
        rows, cols, std, count = (
            np.array(v, dtype=np.float64) for v in zip(*((m.rows, m.cols, m.std, m.count) for m in self.matrices))
        )
        return count, psi_mp(rows, cols, std)

    def nsc_on_grid(self, step: float) -> float:
        """``nsc`` with each matrix's psi_mp rounded to a multiple of ``step`` (a power of two), then counted: plans
        whose layers hold the same matrices in another arrangement (3 + 3 KV groups against 2 + 4) then score
        exactly alike, where their option totals rounded one by one could fall grid steps apart."""
        count, psi = self._capacities
        return float(np.sum(count * np.rint(psi / step))) * step

    @functools.cached_property
    def params(self) -> int:
        return sum(m.params for m in self.matrices) + self.extra_params

    @functools.cached_property
    def macs(self) -> int:
        """Linear-layer multiply-accumulates per token."""
        return sum(m.macs for m in self.matrices) + self.extra_macs


# --------------------------------------------------------------------------------------------
# LLaMA-family decoders


DIMENSION_KEYS = (  # the config's sizes: every one a positive integer, and together the shape of every matrix
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
)


@dataclass(frozen=True)
class DecoderDims:
    """The shape facts of a LLaMA-family config, under Hugging Face names."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # biases on q/k/v
    output_bias: bool = False  # bias on o_proj (llama/mistral/qwen3: same flag; qwen2: never)
    mlp_bias: bool = False
    qk_norm: bool = False
    initializer_range: float = 0.02
    # Facts fixed by model_type (kept out of repr, so a latency table's model fingerprint stays as it was):
    block_norms: int = field(default=2, repr=False)  # hidden-size norm vectors per block (gemma2/3: 4; olmo2: 2 post)
    qk_norm_scope: str = field(default="head", repr=False)  # "head": one head_dim vector each for q and k (qwen3,
    # gemma3); "projection": q_norm over every query head, k_norm over every KV head (olmo2: a KV cut cuts them)

    def __post_init__(self) -> None:
        for name in DIMENSION_KEYS:
            value = getattr(self, name)
            if not is_int(value) or value <= 0:
                raise ConfigError(f"config field {name!r} must be a positive integer; got {value!r}")
        if self.num_hidden_layers > MAX_LAYERS:  # a typo's 1e7 layers ran for minutes before any message
            raise ConfigError(
                f"config field 'num_hidden_layers' must be at most {MAX_LAYERS:,} (the deepest released LLMs have about 126); "
                f"got {self.num_hidden_layers:,}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.num_attention_heads // self.num_key_value_heads


MAX_LAYERS = 1_000  # 8x the deepest released LLMs (Llama 3.1 405B: 126)


DimsParser = Callable[[Mapping[str, Any]], DecoderDims]
_DECODERS: dict[str, DimsParser] = {}
_FAMILY_DEFAULTS: dict[str, Mapping[str, Any]] = {}  # model_type -> DecoderFamily.defaults
_SEARCH_ONLY: dict[str, str] = {}  # model_type -> what the weights jobs lack for it


def register_decoder(model_type: str, parser: DimsParser, search_only: str = "") -> None:
    """Register how a ``model_type`` config maps onto DecoderDims; duplicates are refused. ``search_only`` (what
    the weights jobs still lack, e.g. "its post-norms need their own modeling") marks a type only the search
    supports."""
    if model_type in _DECODERS:
        raise ValueError(f"decoder {model_type!r} is already registered")
    _DECODERS[model_type] = parser
    if search_only:
        _SEARCH_ONLY[model_type] = search_only


def supported_model_types() -> tuple[str, ...]:
    """The ``model_type`` values the search reads as decoders, sorted."""
    return tuple(sorted(_DECODERS))


def _optional_size(config: Mapping[str, Any], key: str) -> int | None:
    """``config[key]`` when set (absent or null: None); ConfigError unless a positive integer (0 is not 'unset')."""
    value = config.get(key)
    if value is not None and not (is_int(value) and value > 0):
        raise ConfigError(f"config.json field {key!r} must be a positive integer or absent; got {value!r}")
    return value


def _with_family_defaults(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """``config`` with its family's transformers defaults under it (``DecoderFamily.defaults``)."""
    return {**_FAMILY_DEFAULTS.get(str(config.get("model_type")), {}), **config}


def config_tied(config: Mapping[str, Any]) -> bool:
    """Whether the model ties ``lm_head`` to the input embedding (its family's default where config.json is silent)."""
    return decoder_dims(config).tie_word_embeddings


def config_head_dim(config: Mapping[str, Any]) -> int:
    """Width of one attention head: ``head_dim`` when the config (or its family's default) sets it, else
    hidden_size / num_attention_heads."""
    config = _with_family_defaults(config)
    head_dim = _optional_size(config, "head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if not head_dim:  # the message blamed a head_dim of 0 the file never set
        raise ConfigError(
            f"config.json sets no head_dim and num_attention_heads ({config['num_attention_heads']}) is more than "
            f"hidden_size ({config['hidden_size']}): hidden_size / num_attention_heads is no head width"
        )
    return int(head_dim)


def config_kv_heads(config: Mapping[str, Any]) -> int:
    """KV heads of a config: ``num_key_value_heads`` when the config (or its family's default) sets it, else
    ``num_attention_heads`` (no GQA)."""
    config = _with_family_defaults(config)
    return int(_optional_size(config, "num_key_value_heads") or config["num_attention_heads"])


@dataclass(frozen=True)
class DecoderFamily:
    """How one model type's config maps onto DecoderDims: the block around the LLaMA matrices.

    ``biases``: ``"flags"`` (``attention_bias`` on q/k/v/o, ``mlp_bias`` on gate/up/down: llama, granite,
    smollm3), ``"qkv"`` (q/k/v always, o never: qwen2 hard-codes them), ``"attention"`` (``attention_bias`` on
    q/k/v/o, never on the MLP: qwen3, gemma2/3, olmo2), ``"none"`` (phi3 and mistral hard-code none, whatever the
    flags say).
    ``defaults`` are the transformers config class's defaults of the optional fields read here (``head_dim``,
    ``tie_word_embeddings``, ``num_key_value_heads``, ...), used when config.json leaves them out, as
    transformers does. ``nullable_sizes``: which of ``head_dim`` and ``num_key_value_heads`` transformers reads as
    absent when config.json sets them null (LLaMA and Mistral fill a null head_dim with hidden / heads, the others
    fail); a null in another is refused, as transformers refuses it.
    """

    defaults: Mapping[str, Any] = field(default_factory=dict)
    nullable_sizes: tuple[str, ...] = ("num_key_value_heads",)  # null read as absent (then hidden / heads, heads)
    biases: str = "flags"
    qk_norm: str = ""  # "", "head" or "projection" (DecoderDims.qk_norm_scope)
    block_norms: int = 2


_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def _config_flag(config: Mapping[str, Any], key: str) -> bool:
    """A true/false field of config.json (absent or null: false); ConfigError for anything else, e.g. the string
    "false", which ``bool`` would read as true."""
    value = config.get(key)
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"config.json field {key!r} must be true or false; got {value!r}")
    return bool(value)


def _register_family(model_type: str, family: DecoderFamily) -> None:
    """Register a decoder read as ``family`` (its defaults also fill ``config_head_dim`` and ``config_kv_heads``)."""
    _FAMILY_DEFAULTS[model_type] = family.defaults
    register_decoder(model_type, _family_parser(family))


def _check_defaulted_sizes(config: Mapping[str, Any], family: DecoderFamily, heads: int) -> None:
    """Refuse a null ``head_dim``/``num_key_value_heads`` of ``config`` (as written) that transformers refuses (it
    was counted as hidden / heads, not the family's default), and name a defaulted KV count that does not divide
    the ``heads``."""
    model_type = config.get("model_type")
    for key in ("head_dim", "num_key_value_heads"):
        if key in config and config[key] is None and key not in family.nullable_sizes:
            raise ConfigError(
                f"config.json field {key!r} must be a positive integer or absent for model_type {model_type!r}; "
                "got None, which transformers refuses"
            )
    kv_default = family.defaults.get("num_key_value_heads")
    if "num_key_value_heads" not in config and kv_default and heads % kv_default:
        raise ConfigError(
            f"config.json sets no num_key_value_heads, so model_type {model_type!r} takes its default, {kv_default}, "
            f"which does not divide num_attention_heads ({heads}): set num_key_value_heads in config.json"
        )


def _family_parser(family: DecoderFamily) -> DimsParser:
    def parse(config: Mapping[str, Any]) -> DecoderDims:
        missing = [key for key in _REQUIRED if key not in config and key not in family.defaults]
        if missing:
            raise ConfigError(
                f"config.json is missing required fields {missing} for model_type {config.get('model_type')!r}"
            )
        given, config = config, {**family.defaults, **config}
        wrong = {key: config[key] for key in _REQUIRED if not (is_int(config[key]) and config[key] > 0)}
        if wrong:
            raise ConfigError(f"config.json fields {sorted(wrong)} must be positive integers; got {wrong}")
        _check_defaulted_sizes(given, family, config["num_attention_heads"])
        if "tie_word_embeddings" in config and config["tie_word_embeddings"] is None:  # null read as untied
            raise ConfigError(
                "config.json field 'tie_word_embeddings' must be true or false (or absent: the family's default, "
                f"{family.defaults.get('tie_word_embeddings', False)}); got None, which transformers refuses"
            )
        attention_bias = _config_flag(config, "attention_bias")
        init_range = config.get("initializer_range", 0.02)
        if not (is_number(init_range) and 0 < init_range < math.inf):
            raise ConfigError(f"config.json field 'initializer_range' must be a positive number; got {init_range!r}")
        return DecoderDims(
            model_type=config["model_type"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_hidden_layers=config["num_hidden_layers"],
            num_attention_heads=config["num_attention_heads"],
            num_key_value_heads=config_kv_heads(config),
            head_dim=config_head_dim(config),
            vocab_size=config["vocab_size"],
            tie_word_embeddings=_config_flag(config, "tie_word_embeddings"),
            attention_bias={"flags": attention_bias, "qkv": True, "attention": attention_bias}.get(
                family.biases, False
            ),
            output_bias=family.biases in ("flags", "attention") and attention_bias,
            mlp_bias=family.biases == "flags" and _config_flag(config, "mlp_bias"),
            qk_norm=bool(family.qk_norm),
            initializer_range=float(init_range),
            block_norms=family.block_norms,
            qk_norm_scope=family.qk_norm or "head",
        )

    return parse


def _nested_text_config(key: str, parse: DimsParser) -> DimsParser:
    """A multimodal config whose language model's config is nested under ``key`` (gemma3: ``text_config``): the
    search prunes the language model, so its counts are the language model's (the vision tower is not counted)."""

    def parse_nested(config: Mapping[str, Any]) -> DecoderDims:
        text = config.get(key)
        if not isinstance(text, Mapping):
            raise ConfigError(
                f"config.json of model_type {config.get('model_type')!r} must hold its language model's config "
                f"under {key!r}; got {text!r}. Fix config.json"
            )
        # the wrapper ties its head by its own flag (transformers' default true), whatever text_config says
        tied = config.get("tie_word_embeddings", True)
        try:
            return parse({**text, "model_type": config["model_type"], "tie_word_embeddings": tied})
        except ConfigError as err:  # its fields are read under `key` alone: a top-level one is not its model's
            raise ConfigError(f"{err} (model_type {config['model_type']!r} reads these fields under {key!r})") from err

    return parse_nested


# Gemma 2/3: explicit head_dim (not hidden / heads), GeGLU, RMSNorm(1 + w), embeddings x sqrt(hidden), tied
# embeddings, a norm before and after attention and the MLP (4 per block); Gemma 3 adds per-head q/k norms.
_GEMMA_DEFAULTS = {"head_dim": 256, "tie_word_embeddings": True, "num_key_value_heads": 4}  # null: refused
_GEMMA3_TEXT_DEFAULTS = {  # Gemma3TextConfig's defaults: a gemma3 config.json's text_config often relies on them
    **_GEMMA_DEFAULTS,
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
}
GEMMA2 = DecoderFamily(defaults=_GEMMA_DEFAULTS, nullable_sizes=(), biases="attention", block_norms=4)
GEMMA3 = DecoderFamily(defaults=_GEMMA_DEFAULTS, nullable_sizes=(), biases="attention", qk_norm="head", block_norms=4)
# Phi-3 / Phi-4-mini: fused qkv_proj ((heads + 2 kv) * head_dim x hidden) and gate_up_proj (2 ffn x hidden) hold
# the same weights as LLaMA's q/k/v and gate/up, so they are counted and scored as their parts (per-head Q, K, V;
# gate and up); no biases. partial_rotary_factor and LongRoPE change no weight.
PHI3 = DecoderFamily(biases="none")
# OLMo 2: norms after attention and the MLP (2 per block, none before) and q/k norms over the whole projection.
OLMO2 = DecoderFamily(biases="attention", qk_norm="projection")
# Granite (embedding/residual/attention multipliers, logits_scaling) and SmolLM3 (no rotary embedding in every 4th
# layer) have LLaMA's weights: their quirks are scalars and rotations, not weights.
SMOLLM3 = DecoderFamily(defaults={"tie_word_embeddings": True, "num_key_value_heads": 4})

# Mistral and Qwen fill a missing num_key_value_heads (and Qwen3 head_dim) with a constant, not from the heads.
_register_family("llama", DecoderFamily(nullable_sizes=("head_dim", "num_key_value_heads")))
_register_family(
    "mistral", DecoderFamily(defaults={"num_key_value_heads": 8}, nullable_sizes=("head_dim",), biases="none")
)
_register_family("qwen2", DecoderFamily(defaults={"num_key_value_heads": 32}, biases="qkv"))
_register_family(
    "qwen3", DecoderFamily(defaults={"num_key_value_heads": 32, "head_dim": 128}, biases="attention", qk_norm="head")
)
_register_family("gemma2", GEMMA2)
_register_family("gemma3_text", GEMMA3)
register_decoder(
    "gemma3",
    _nested_text_config("text_config", _family_parser(dataclasses.replace(GEMMA3, defaults=_GEMMA3_TEXT_DEFAULTS))),
    search_only="the multimodal wrapper nests its language model under text_config beside a vision tower, which "
    "need their own cut and checkpoint layout (its text model alone, gemma3_text, is supported)",
)
_register_family("phi3", PHI3)
_register_family("granite", DecoderFamily())
_register_family("olmo2", OLMO2)
_register_family("smollm3", SMOLLM3)


def search_only_reason(model_type: str | None) -> str:
    """What the weights jobs lack for ``model_type`` (a search-only family); "" when they support it."""
    return _SEARCH_ONLY.get(str(model_type), "")


def weights_model_types() -> tuple[str, ...]:
    """Model types every weights job supports (extraction, healing, evaluation, profiling, psi_W, measured)."""
    return tuple(t for t in supported_model_types() if t not in _SEARCH_ONLY)


def require_weights_support(config: Mapping[str, Any], job: str) -> None:
    """Refuse, in one line naming the type and what is missing, a search-only model type in a weights job
    (``job``: "extraction", "--score psi_w", ...). Types the search does not know pass through: the job's
    own check names them; a ``model_type`` that is not a string is refused here, before any lookup by it."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise UnsupportedArchitectureError(must_be("config.json's model_type", "a string such as 'llama'", model_type))
    reason = search_only_reason(model_type)
    if reason:
        raise UnsupportedArchitectureError(
            f"{job} of {model_type} is not supported yet: {reason}; supported: {', '.join(weights_model_types())}. "
            "The search (nsc-prune --model M --budget B) supports it"
        )


NO_KV_CUTS = {
    "olmo2": "its q_norm and k_norm normalise each token over every head's features, so the kept heads' queries and "
    "keys depend on the removed heads' and no smaller model equals the masked original",
}
"""``model_type`` -> why no exact KV-group cut exists: its plans and spaces keep every KV group (FFN cuts and
dropped layers are exact)."""


def refuse_kv_cuts(
    model_type: str | None, layers: Sequence[Iterable[LayerPlan]], kv_heads: Sequence[int], job: str
) -> None:
    """Raise ``UnsupportedArchitectureError`` in one line when ``job`` would cut KV groups of a ``NO_KV_CUTS`` type:
    ``layers`` holds the plans (a plan, a space's options) of each base layer, ``kv_heads`` its KV heads."""
    if str(model_type) not in NO_KV_CUTS:
        return
    if any(p.keep and p.groups_of(kv) < kv for plans, kv in zip(layers, kv_heads, strict=True) for p in plans):
        raise UnsupportedArchitectureError(
            f"{job} of {model_type} cannot cut KV groups: {NO_KV_CUTS[str(model_type)]}; keep every KV group "
            "(e.g. --space ffn-grid, or a plan with full kv_groups): FFN cuts and dropped layers are exact"
        )


MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")  # experts per MoE layer, under each HF name


def _as_count(value: Any) -> float:
    """``value`` as a number when it reads as one (8, 8.0, "8"), else 0."""
    if isinstance(value, bool):
        return 0
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0


def decoder_dims(config: Mapping[str, Any]) -> DecoderDims:
    """Parse an HF ``config.json`` dict of a supported LLaMA-family model (dense: a mixture-of-experts config is
    refused whatever its ``model_type`` says, as its FFN is not one gate/up/down block)."""
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"a model config must be config.json's dict; got {config!r} (for a preset name, read its config with "
            "nsc_prune.presets.resolve_model)"
        )
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in _DECODERS:
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} is not supported; supported LLaMA-family types: "
            f"{', '.join(weights_model_types())}; for the search only: {', '.join(sorted(_SEARCH_ONLY))}"
        )
    # 8.0 or "8" is a mixture too (transformers refuses it later): not a dense model to price
    experts = {key: config[key] for key in MOE_KEYS if _as_count(config.get(key)) > 1}
    if experts:
        raise UnsupportedArchitectureError(
            f"{model_type} config with mixture-of-experts layers ({', '.join(f'{k}={v}' for k, v in experts.items())}) "
            "is not supported: nsc-prune prunes dense FFN blocks (one gate/up/down per layer), not experts"
        )
    return _DECODERS[model_type](config)


def config_biases(config: Mapping[str, Any]) -> tuple[bool, bool]:
    """Whether a ``config`` model's attention and its MLP have biases, as transformers builds them (Mistral's
    ``attention_bias: true`` builds none; Qwen2's q/k/v always have them)."""
    dims = decoder_dims(config)
    return dims.attention_bias or dims.output_bias, dims.mlp_bias


# config.json keys of checkpoints written by ``nsc-prune extract`` (sparse, keyed by layer index as a string):
PER_LAYER_KEY = "per_layer_config"  # {"3": {"intermediate_size": 960}} (transformers' heterogeneous layers)
PER_LAYER_HEADS_KEY = "nsc_per_layer_attention"  # {"3": {"num_attention_heads": 6, "num_key_value_heads": 2}}
PER_LAYER_FIELDS = ("intermediate_size", "num_attention_heads", "num_key_value_heads")


def _layer_overrides(config: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    overrides: dict[int, dict[str, Any]] = {}
    for key in (PER_LAYER_KEY, PER_LAYER_HEADS_KEY):
        entries = config.get(key) or {}
        if not isinstance(entries, Mapping):
            raise ConfigError(
                f"config field {key!r} must be an object keyed by layer index, e.g. "
                f'{{"3": {{"intermediate_size": 960}}}}; got {entries!r}. Fix the checkpoint\'s config.json'
            )
        for index, values in entries.items():
            # not "²"; not "01", which the model's own code (it looks up str(i)) never reads, and which met "1" here
            canonical = str(index).isascii() and str(index).isdigit() and str(int(index)) == str(index)
            if not (canonical and isinstance(values, Mapping)):
                raise ConfigError(
                    f"config field {key!r} must map layer indices (0, 1, ..., no leading zeros) to objects; got "
                    f"{index!r}: {values!r}. Fix the checkpoint's config.json"
                )
            overrides.setdefault(int(index), {}).update(values)
    for index, values in overrides.items():  # the pruned model's attention reads both (modeling_nsc_llama)
        heads = [key for key in ("num_attention_heads", "num_key_value_heads") if key in values]
        if len(heads) == 1:
            other = {"num_attention_heads": "num_key_value_heads", "num_key_value_heads": "num_attention_heads"}
            raise ConfigError(
                f"layer {index} of the per-layer config ({PER_LAYER_KEY!r} / {PER_LAYER_HEADS_KEY!r}) sets "
                f"{heads[0]} but not {other[heads[0]]}. Fix the checkpoint's config.json"
            )
    return overrides


def layer_value(config: Mapping[str, Any], layer: int, key: str) -> Any:
    """``key`` of decoder layer ``layer``: its ``per_layer_config`` / per-layer heads entry, else the global value
    (or its family's transformers default)."""
    return _layer_overrides(config).get(layer, {}).get(key, _with_family_defaults(config).get(key))


def layer_dims(config: Mapping[str, Any]) -> tuple[DecoderDims, ...]:
    """One DecoderDims per decoder layer: the global config with each layer's ``per_layer_config`` width and
    per-layer heads (a checkpoint written by ``nsc-prune extract``) applied; all equal for a plain model."""
    dims = decoder_dims(config)
    overrides = _layer_overrides(config)
    outside = sorted(i for i in overrides if i >= dims.num_hidden_layers)
    if outside:
        raise ConfigError(
            f"per-layer config entries must name layers 0..{dims.num_hidden_layers - 1}; got layers {outside}. "
            "Fix the checkpoint's config.json"
        )
    out = []
    for i in range(dims.num_hidden_layers):
        layer = {k: v for k, v in overrides.get(i, {}).items() if k in PER_LAYER_FIELDS}
        if not layer:
            out.append(dims)
            continue
        try:
            out.append(dataclasses.replace(dims, **layer))
        except ConfigError as err:
            raise ConfigError(f"layer {i} of the per-layer config: {err}") from err
    return tuple(out)


LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def projection_shapes(hidden: int, head_dim: int, heads: int, kv_heads: int, ffn: int) -> dict[str, tuple[int, int]]:
    """``(out, in)`` of each projection of a decoder layer, keyed by its HF path (``self_attn.q_proj``, ...)."""
    return {
        "self_attn.q_proj": (heads * head_dim, hidden),
        "self_attn.k_proj": (kv_heads * head_dim, hidden),
        "self_attn.v_proj": (kv_heads * head_dim, hidden),
        "self_attn.o_proj": (hidden, heads * head_dim),
        "mlp.gate_proj": (ffn, hidden),
        "mlp.up_proj": (ffn, hidden),
        "mlp.down_proj": (hidden, ffn),
    }


FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
"""Fused projections -> their parts, stacked along the rows in this order."""
FUSED_TYPES = ("phi3",)
"""Model types whose layers hold the ``FUSED`` projections instead of their parts (Phi-3, Phi-4-mini)."""
FUSED_LORA_MODULES = tuple(path.rsplit(".", 1)[-1] for path in FUSED)  # qkv_proj, gate_up_proj


def fused_targets(targets: Sequence[str], names: Collection[str]) -> tuple[str, ...]:
    """``targets`` with each part a model holds only fused (Phi-3's q/k/v_proj, gate/up_proj) replaced by its fused
    module (qkv_proj, gate_up_proj), once; ``names``: the model's module names (last path component)."""
    fused = {part.rsplit(".", 1)[-1]: module.rsplit(".", 1)[-1] for module, parts in FUSED.items() for part in parts}
    out = [fused[t] if t not in names and fused.get(t) in names else t for t in targets]
    return tuple(dict.fromkeys(out))


def lora_module_names(model_type: str | None) -> tuple[str, ...]:
    """The projections a LoRA can adapt in a decoder layer of ``model_type``: LLaMA's seven, or with the fused
    projections in place of their parts (``FUSED_TYPES``)."""
    if model_type not in FUSED_TYPES:
        return LORA_MODULES
    return fused_targets(LORA_MODULES, {"o_proj", "down_proj", *FUSED_LORA_MODULES})


def layer_lora_targets(targets: Sequence[str], model_type: str | None) -> tuple[tuple[str, ...], list[str]]:
    """``targets`` as a ``model_type`` layer names them (``fused_targets``), and those of them it lacks (``lm_head``,
    or ``qkv_proj`` on LLaMA), sorted: the one check of LoRA targets against a family's projections."""
    names = lora_module_names(model_type)
    mapped = fused_targets(targets, names)
    return mapped, sorted(set(mapped) - set(names))


@dataclass(frozen=True)
class DecoderLayerChoice:
    """Per-layer elastic choices of a decoder block. ``lora`` maps module name -> rank."""

    ffn: int
    kv_heads: int
    lora: Mapping[str, int] = field(default_factory=dict)


def decoder_layer_option(
    dims: DecoderDims, choice: DecoderLayerChoice, init: str | float, label: LayerPlan | Mapping[str, Any]
) -> LayerOption:
    """Matrices and costs of one decoder block under ``choice`` (kept KV groups keep their
    query heads, so GQA stays valid), labelled ``label`` (the space's ``LayerPlan``)."""
    if choice.ffn < 0 or choice.ffn > dims.intermediate_size:
        raise InvalidInputError(f"FFN width must be in 0..{dims.intermediate_size}; got {choice.ffn}")
    if choice.kv_heads < 0 or choice.kv_heads > dims.num_key_value_heads:
        raise InvalidInputError(f"kv_heads must be in 0..{dims.num_key_value_heads}; got {choice.kv_heads}")
    d, hd, ffn = dims.hidden_size, dims.head_dim, choice.ffn
    heads = choice.kv_heads * dims.group_size

    def std(rows: int, cols: int) -> float:
        return float(init_std(rows, cols, init))

    shapes: list[tuple[str, int, int, int]] = []  # name, rows, cols, count (for the scored matrices)
    if heads:
        shapes += [
            ("q_proj", hd, d, heads),
            ("k_proj", hd, d, choice.kv_heads),
            ("v_proj", hd, d, choice.kv_heads),
            ("o_proj", d, heads * hd, 1),  # one matrix over the concatenated heads, as the paper scores it
        ]
    if ffn:
        shapes += [("gate_proj", ffn, d, 1), ("up_proj", ffn, d, 1), ("down_proj", d, ffn, 1)]
    matrices = [Matrix(rows, cols, std(rows, cols), count, name) for name, rows, cols, count in shapes]
    shapes_by_path = projection_shapes(d, hd, heads, choice.kv_heads, ffn)
    for fused, parts in FUSED.items():  # a fused projection: its parts' rows stacked, one input
        shapes_by_path[fused] = (sum(shapes_by_path[part][0] for part in parts), shapes_by_path[parts[0]][1])
    full_io = {path.split(".")[-1]: shape for path, shape in shapes_by_path.items()}
    for module, rank in choice.lora.items():
        out_f, in_f = full_io[module]
        if rank and out_f and in_f:
            matrices += [
                Matrix(rank, in_f, std(rank, in_f), 1, f"{module}.lora_A", lora=True),
                Matrix(out_f, rank, std(out_f, rank), 1, f"{module}.lora_B", lora=True),
            ]
    extra = dims.block_norms * d if (heads or ffn) else 0  # the block's RMSNorms (2; gemma2/3: 4)
    if dims.attention_bias and heads:
        extra += (heads + 2 * choice.kv_heads) * hd
    if dims.output_bias and heads:
        extra += d
    if dims.mlp_bias and ffn:
        extra += 2 * ffn + d
    if dims.qk_norm and heads:  # per head: one head_dim vector each; over the projection: cut with the KV groups
        extra += 2 * hd if dims.qk_norm_scope == "head" else (heads + choice.kv_heads) * hd
    label = label if isinstance(label, LayerPlan) else dict(label)
    return LayerOption(label=label, matrices=tuple(matrices), extra_params=extra)


def decoder_fixed_option(dims: DecoderDims) -> LayerOption:
    """The parts outside the blocks: embeddings, final norm, lm_head (its MACs count)."""
    embed = dims.vocab_size * dims.hidden_size
    lm_head_params = 0 if dims.tie_word_embeddings else embed
    return LayerOption(
        label={"part": "embeddings+lm_head"},
        matrices=(),
        extra_params=embed + lm_head_params + dims.hidden_size,
        extra_macs=embed,
    )


def decoder_full_option(dims: DecoderDims, init: str | float) -> LayerOption:
    """The unpruned block of ``dims`` (all heads, full FFN, no LoRA)."""
    choice = DecoderLayerChoice(ffn=dims.intermediate_size, kv_heads=dims.num_key_value_heads)
    return decoder_layer_option(dims, choice, init, LayerPlan(ffn=dims.intermediate_size))


def model_params(config: Mapping[str, Any]) -> int:
    """Parameters of the model of a HF config dict: its blocks as they are (a pruned checkpoint's own widths) and
    the parts outside them, counted as the search counts a plan's."""
    blocks = sum(decoder_full_option(dims, "xavier").params for dims in layer_dims(config))
    return int(decoder_fixed_option(decoder_dims(config)).params + blocks)


def score(config: Mapping[str, Any], init: str | float = "xavier") -> float:
    """NSC of a whole LLaMA-family HF config dict (Eq. 6): the sum of every block's capacity (per-layer
    widths and heads of a pruned checkpoint included)."""
    return sum(decoder_full_option(dims, init).nsc for dims in layer_dims(config))

"""Loading checkpoints without remote code, and the one "which tensors does this config imply" check.

``load_pruned`` sits below every user (evaluation, calibration, training), not on top of extraction.
"""

from __future__ import annotations

import copy
import functools
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nsc_prune._files import (
    ADAPTER_CONFIG_NAME,
    ADAPTER_DIR,
    ADAPTER_WEIGHTS_NAME,
    CONFIG_NAME,
    TOKENIZER_CORE_FILES,
    has_tokenizer,
)
from nsc_prune._io import read_json_object
from nsc_prune._validation import must_be
from nsc_prune._warn import warn
from nsc_prune.errors import ConfigError, InvalidInputError, UnsupportedArchitectureError, require
from nsc_prune.hf.modeling import DECILM_TYPE
from nsc_prune.hf.progress import library_bars
from nsc_prune.hf.weights.safetensors_io import (
    TensorSpec,
    check_float_weights,
    index_model_dir,
    meta_shapes,
    read_header,
    shape_problems,
)
from nsc_prune.hf.weights.values import all_finite
from nsc_prune.presets import read_model_config

torch = require("torch", "hf")


def load_tokenizer(folder: str | os.PathLike, fix: str) -> Any:
    """The tokenizer in ``folder`` (never remote code); InvalidInputError in one line, ending in ``fix``, when the
    folder has none or its files do not load (a tokenizer.json that is not JSON was a traceback in heal)."""
    transformers = require("transformers", "hf")
    if not has_tokenizer(folder):
        raise InvalidInputError(f"{folder} has no tokenizer ({' or '.join(TOKENIZER_CORE_FILES)}); {fix}")
    try:
        config = {}
        found = Path(folder) / CONFIG_NAME
        if found.is_file() and read_json_object(found).get("model_type") == DECILM_TYPE:
            # the class transformers cannot resolve without remote code; found by itself it warns that the
            # checkpoint "can yield errors"
            config = {"config": pruned_classes()[DECILM_TYPE][0].from_pretrained(folder)}
        return transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=False, **config)
    except Exception as err:  # json's, tokenizers', sentencepiece's and transformers' own errors alike
        raise InvalidInputError(
            f"cannot load a tokenizer from {folder}: {type(err).__name__}: {' '.join(str(err).split())}; {fix}"
        ) from err


def bos_token_added(tokenizer: Any) -> int | None:
    """The BOS id ``tokenizer`` puts before every text by default (LLaMA's, Gemma's), else None (SmolLM2's, Qwen's):
    what lm-eval and a served model's prompt start with, so training and calibration start with it too. Read from
    what it does, not from its ``bos_token`` (tokenizer files may add one they do not name)."""
    try:
        plain = tokenizer("a", add_special_tokens=False)["input_ids"]
        full = tokenizer("a")["input_ids"]
    except Exception:  # a closed word-level vocabulary without "a" or <unk>: an empty text has no word to miss
        full = tokenizer("")["input_ids"]
        return full[0] if full[:1] == [tokenizer.bos_token_id] else None
    return full[0] if len(full) > len(plain) and full[1 : 1 + len(plain)] == plain else None


MOSTLY_UNKNOWN = 0.5  # a share of unknown tokens no text a model's own tokenizer reads comes near


def warn_if_mostly_unknown(tokenizer: Any, docs: Sequence[Sequence[int]], what: str) -> None:
    """Warn when most ids of ``docs`` are ``tokenizer``'s unknown token (a word-level tokenizer reading text of
    another language or encoding, or another model's tokenizer): the run would train or calibrate on that one token,
    and nothing else would say so. A BPE or SentencePiece tokenizer without byte fallback fuses unknown characters
    into one <unk> beside a known piece, so a script it lacks can stay under the share."""
    unknown = getattr(tokenizer, "unk_token_id", None)
    total = sum(map(len, docs))
    if unknown is None or not total:
        return
    share = sum(doc.count(unknown) for doc in docs) / total
    if share > MOSTLY_UNKNOWN:
        warn(
            f"{share:.0%} of the {total:,} tokens of {what} are the tokenizer's unknown token "
            f"{tokenizer.unk_token!r}: is it the model's tokenizer, and the text in a script and encoding it reads?",
            UserWarning,
        )


def pruned_classes() -> dict[str, tuple[type, type]]:
    """``model_type`` -> (config class, model class) of the package's own classes: per-layer LLaMA-family models
    (``modeling_nsc_llama``) and ``nemotron-nas`` (``modeling_nsc_decilm``, as shipped in those checkpoints)."""
    transformers = require("transformers", "hf")
    from nsc_prune.hf.modeling.modeling_nsc_decilm import DeciLMConfig, DeciLMForCausalLM
    from nsc_prune.hf.modeling.modeling_nsc_llama import MODEL_CLASSES

    classes = {key: (transformers.CONFIG_MAPPING[key], cls) for key, cls in MODEL_CLASSES.items()}
    return {**classes, DECILM_TYPE: (DeciLMConfig, DeciLMForCausalLM)}


def _pruned_model(config: Mapping[str, Any]) -> Any:
    """The model of ``config`` as the package's own class for its model type builds it (per-layer widths, heads)."""
    config_class, model_class = pruned_classes()[config["model_type"]]
    return model_class(parse_config(config_class, config))


def meta_model(config: Mapping[str, Any], pruned: bool, what: str) -> Any:
    """The model of ``config`` on the meta device (no memory): the package's class (``pruned``) or the stock one;
    ConfigError naming ``what`` when transformers cannot build it (a ``pad_token_id`` past the vocabulary is torch's
    AssertionError, an unknown ``hidden_act`` a KeyError)."""
    try:
        with torch.device("meta"):
            return _pruned_model(config) if pruned else stock_model(config)
    except ConfigError as err:
        raise ConfigError(f"{what}: {err}") from err
    except Exception as err:
        message = " ".join(line.strip() for line in str(err).splitlines())  # transformers' messages span lines
        raise ConfigError(
            f"{what}: transformers cannot build a model from config.json: {type(err).__name__}: {message}"
        ) from err


def stock_model(config: Mapping[str, Any]) -> Any:
    """The stock causal LM of ``config`` as ``AutoModelForCausalLM`` builds it (never remote code), on the current
    device (build it under ``torch.device("meta")`` to hold no memory)."""
    transformers = require("transformers", "hf")
    parsed = parse_config(transformers.CONFIG_MAPPING[config["model_type"]], config)
    return transformers.AutoModelForCausalLM.from_config(parsed, trust_remote_code=False)


def names_as_loaded(model: Any, stored: Iterable[str]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """How transformers loads a stock checkpoint's ``stored`` tensor names into ``model`` (built on the meta
    device): the name each is loaded as (loaded -> stored; the renamings it keeps per model type, e.g. GPT-NeoX's
    ``embed_out`` is the model's ``lm_head`` since transformers 5, and the base model's prefix added or dropped), and
    the tensors it builds from several stored ones (Mixtral's experts, fused on load: fused name -> stored names),
    whose shapes no stored tensor has. The names as stored when this transformers has no such mapping."""
    try:  # transformers' own loader; not public API, so its absence leaves the names as stored
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming, rename_source_key
    except ImportError:
        return {name: name for name in stored}, {}
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if not isinstance(t, WeightRenaming)]
    meta_state = model.state_dict()
    loaded: dict[str, str] = {}
    fused: dict[str, list[str]] = {}
    for name in stored:
        renamed, converted = rename_source_key(name, renamings, converters, model.base_model_prefix, meta_state)
        if converted is None:
            loaded[renamed] = name
        else:
            fused.setdefault(renamed, []).append(name)
    return loaded, fused


def parse_config(config_class: type, config: Mapping[str, Any]) -> Any:
    """``config_class.from_dict(config)``; ConfigError naming the field when transformers rejects a value (its
    configs validate types since 5.0, e.g. ``rms_norm_eps: "x"``) or fails on one (``dtype: "bfloat16x"`` is an
    AttributeError of its own code, ``quantization_config: 255`` another)."""
    try:
        return config_class.from_dict(copy.deepcopy(dict(config)))  # transformers edits nested dicts in place
    except Exception as err:
        message = " ".join(line.strip() for line in str(err).splitlines()) or type(err).__name__
        raise ConfigError(f"config.json does not load in transformers: {message}") from err


def filled_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with every field its transformers config class fills when config.json leaves it out (rope theta,
    ``rms_norm_eps``, Gemma's ``layer_types`` and ``query_pre_attn_scalar``, Granite's multipliers, ...): what a
    writer of another format reads, so the model it writes is the one transformers runs."""
    transformers = require("transformers", "hf")
    return parse_config(transformers.CONFIG_MAPPING[config["model_type"]], config).to_dict()


def is_rotary_buffer(name: str) -> bool:
    """Whether the stored tensor ``name`` is a rotary ``inv_freq`` buffer some old checkpoints carry (non-persistent:
    transformers recomputes it and ignores the stored one)."""
    return name.endswith("rotary_emb.inv_freq")


def check_checkpoint_shapes(path: Path, config: Mapping[str, Any], found: Mapping[str, Any], pruned: bool) -> None:
    """Fail on the first tensor the model of ``config`` implies (built on the meta device: no memory) that the
    safetensors headers ``found`` of checkpoint ``path`` lack, hold with another shape, or (``pruned``: the
    package's own class) hold in excess; stock checkpoints may carry tensors transformers ignores, and are read
    under the names transformers loads them as (``names_as_loaded``); the model's integer weights (a quantized
    checkpoint's codes) are refused first. Tensors are named as stored."""
    found = {name: info for name, info in found.items() if not is_rotary_buffer(name)}  # not the model's own
    model = meta_model(config, pruned, f"checkpoint {path}")
    expected, tied = meta_shapes(lambda: model)
    stored, fused = ({name: name for name in found}, {}) if pruned else names_as_loaded(model, found)
    own = [stored[name] for name in expected if name in stored] + [s for n in expected for s in fused.get(n, [])]
    check_float_weights(found, f"checkpoint {path}", own)
    problems = shape_problems(
        {name: shape for name, shape in expected.items() if name not in fused},
        [[name for name in names if name not in fused] for names in tied if not set(names) <= set(fused)],
        {name: tuple(found[stored_name].shape) for name, stored_name in stored.items()},
    )
    if "mis-shaped" in problems:
        name = problems["mis-shaped"][0]
        raise ConfigError(
            f"checkpoint {path} does not match its config.json: tensor {stored[name]} should be "
            f"{list(expected[name])} but the weights hold {list(found[stored[name]].shape)} "
            f"({len(problems['mis-shaped'])} mismatching tensor(s)); re-extract the checkpoint or fix config.json"
        )
    if "missing" in problems:
        name = problems["missing"][0]
        raise ConfigError(
            f"checkpoint {path} lacks tensor {name} (shape {list(expected[name])}) that its config.json "
            f"implies ({len(problems['missing'])} missing); the checkpoint is incomplete"
        )
    if "unexpected" in problems and pruned:
        raise ConfigError(
            f"checkpoint {path} holds tensor {problems['unexpected'][0]} that its config.json does not describe "
            f"({len(problems['unexpected'])} extra); re-extract the checkpoint or fix config.json"
        )


def from_pretrained(model_class: Any, path: str | os.PathLike, **kwargs: Any) -> Any:
    """``model_class.from_pretrained(path, **kwargs)`` running no code from the Hub: no remote modeling code
    (``trust_remote_code=False``) and no Hub kernels (``use_kernels=False``; transformers 5.25 turned them on by
    default, which swaps layers for code downloaded at load time and refuses a model on the meta device).
    transformers' loading bar shows where ours would (``nsc_prune.hf.progress.library_bars``)."""
    with library_bars():
        return model_class.from_pretrained(path, trust_remote_code=False, use_kernels=False, **kwargs)


def non_finite_parameter(model: Any) -> str | None:
    """The name of the first parameter of ``model`` holding NaN or inf, or None (weights offloaded to the meta
    device by ``device_map="auto"`` are not read)."""
    return next(
        (n for n, w in model.named_parameters() if w.device.type != "meta" and not all_finite(w.detach())), None
    )


def check_trainable(model: Any, what: str) -> Any:
    """``model``, unless a parameter holds NaN or inf: then InvalidInputError naming it (training from it was
    reported as a divergence at the first step, with advice to lower the learning rate)."""
    spoilt = non_finite_parameter(model)
    if spoilt is not None:
        raise InvalidInputError(f"{what}: {spoilt} holds NaN or inf values; no training can start from them")
    return model


def check_loadable(config: Mapping[str, Any], specs: list[TensorSpec]) -> None:
    """Fail before writing anything unless the model ``config`` builds (on the meta device: no memory) has
    exactly the tensors ``specs`` announce, name for name and shape for shape (tied weights may be absent)."""
    transformers = require("transformers", "hf")
    model = meta_model(config, True, "the output config")
    expected, tied = meta_shapes(lambda: model)
    written = {spec.name: tuple(spec.shape) for spec in specs}
    problems = shape_problems(expected, tied, written)
    if problems:
        described = {"mis-shaped": lambda n: f"{n} {list(written[n])} (model: {list(expected[n])})"}
        first_few = {kind: [described.get(kind, str)(n) for n in names[:3]] for kind, names in problems.items()}
        raise ConfigError(
            f"the {config['model_type']} checkpoint would not load: {first_few}; "
            f"the base's tensors do not match what transformers {transformers.__version__} builds from its config.json "
            "(report this with the base's config.json)"
        )


def load_pruned(
    path: str | os.PathLike,
    dtype: str | torch.dtype | None = None,
    device_map: str | dict | None = None,
    adapter: bool = True,
) -> torch.nn.Module:
    """Load the checkpoint folder ``path`` written by ``extract_subnet`` (any folder ``--format``: pruned, padded,
    nemotron-nas; a GGUF file is llama.cpp's) or a stock safetensors folder of a type in
    ``nsc_prune.hf.modeling.ARCHITECTURES``, without remote code; ``dtype`` (a torch dtype or its name; None: the
    config's) and ``device_map`` go to ``from_pretrained``; ``adapter``: attach its ``adapter/`` if it has one.

    Refuses pickle weights and fails loudly on any missing, unexpected or mis-shaped tensor.
    """
    classes = pruned_classes()
    path = Path(path)
    config = read_model_config(path, "the checkpoint", "a folder")
    model_type = config.get("model_type")
    if model_type not in classes:
        raise UnsupportedArchitectureError(
            must_be(
                f"the model_type in {path / CONFIG_NAME}",
                f"one of {sorted(classes)} for load_pruned",
                model_type,
                "Load it with transformers.AutoModelForCausalLM instead",
            )
        )
    if not config.get("quantization_config"):  # packed quantized weights do not have the config's shapes
        check_checkpoint_shapes(path, config, index_model_dir(path), pruned=True)  # a line, not transformers' error
    else:
        index_model_dir(path)  # safetensors present and whole; refuses pickles
    model, info = from_pretrained(
        classes[model_type][1],
        path,
        dtype=dtype or "auto",
        device_map=device_map,
        use_safetensors=True,
        output_loading_info=True,
    )
    problems = {k: sorted(v) for k, v in info.items() if k != "error_msgs" and v}
    if problems or info.get("error_msgs"):
        raise ConfigError(f"{path} does not match its config: {problems or info['error_msgs']}")
    if config.get("auto_map"):
        _saves_its_modeling_files(model, config["auto_map"])
    if adapter and (path / ADAPTER_DIR / ADAPTER_CONFIG_NAME).is_file():
        model = _with_kept_adapter(model, path / ADAPTER_DIR)
    return model.eval()


def _saves_its_modeling_files(model: Any, auto_map: Mapping[str, str]) -> None:
    """Mark this ``model`` (and its config) as remote code for the classes its ``auto_map`` names, so that
    ``save_pretrained`` writes the modeling files (the installed package's, which extract ships) on the saving rank
    and before a ``push_to_hub`` upload, as for a model loaded with ``trust_remote_code``. On the instance, not the
    class: ``register_for_auto_class`` would mark every later model of the class in this process, stock-shaped ones
    too (transformers reads both attributes through ``self``)."""
    model._auto_class = "AutoModelForCausalLM"
    model.is_remote_code = functools.partial(bool, True)
    if "AutoConfig" in auto_map:
        model.config._auto_class = "AutoConfig"


def _with_kept_adapter(model: Any, folder: Path) -> Any:
    """``model`` wrapped in the PEFT adapter of ``folder``, whose file must hold exactly the LoRA tensors PEFT builds
    (PEFT fills a missing one with a fresh init, with a warning, and reports a mis-shaped one in a traceback)."""
    from nsc_prune.hf.weights.adapter import peft_wrapping

    weights = folder / ADAPTER_WEIGHTS_NAME
    if not weights.is_file():  # PEFT would fall back to pickle files
        raise InvalidInputError(f"{folder} has no {ADAPTER_WEIGHTS_NAME}; re-run the extraction")
    peft = require("peft", "hf")
    try:
        with peft_wrapping(), warnings.catch_warnings():
            # refused below, in one line ("unexpected" since PEFT 0.22)
            warnings.filterwarnings("ignore", message="Found (missing|unexpected) adapter keys")
            wrapped = peft.PeftModel.from_pretrained(model, folder)
    except RuntimeError as err:  # torch's "size mismatch for ...": one line per tensor
        mismatch = [line.strip() for line in str(err).splitlines() if "size mismatch" in line]
        if not mismatch:  # out of memory and the like: not the adapter's fault
            raise
        raise ConfigError(f"{folder} does not fit its checkpoint: {mismatch[-1]}") from err
    built = {name: tuple(t.shape) for name, t in peft.get_peft_model_state_dict(wrapped).items()}
    stored = {name: tuple(info.shape) for name, info in read_header(weights).items()}
    if built != stored:
        missing, extra = sorted(set(built) - set(stored)), sorted(set(stored) - set(built))
        what = f"lacks {missing[0]}" if missing else f"holds {extra[0]}, which PEFT does not build"
        count = len(missing) + len(extra)
        raise ConfigError(f"{weights} {what}{f' ({count - 1} more)' if count > 1 else ''}; re-run the extraction")
    return wrapped

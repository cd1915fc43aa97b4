"""Super-adapter training: one PEFT LoRA adapter that serves every point of an elastic space.

Channel order first. The base's FFN channels and KV groups are ranked by importance (``activation`` on
the training text, or ``magnitude``; ``nsc_prune.hf.cut.selection``) and the orders are stored in the adapter
folder (``CHANNEL_ORDER_NAME``). Nothing is permuted on disk: the LoRA tensors stay in the base's own
coordinates (so the adapter still loads with stock PEFT on the original base), and ``nsc-prune extract
--adapter`` picks the orders up and keeps ``order[:k]`` of base and LoRA alike (``nsc_prune.hf.cut.keep``).

Each training step runs several subnets (``nsc_prune.hf.train.subnets``): the sandwich rule (largest, smallest
and ``n`` random plans of the space) or points drawn from a given front, each masking exactly what extraction
cuts. The teacher of ``--teacher base`` is the same model with the adapter disabled and no mask.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsc_prune._deprecated import forward_moved
from nsc_prune._files import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, CHANNEL_ORDER_NAME, SUPERNET_RECORD_NAME
from nsc_prune._io import (
    WRITTEN_FILES_KEY,
    atomic_dir,
    atomic_write_text,
    claimed_work_dir,
    missing_parents,
    provenance,
    read_json_object,
    remove_work_dir,
    sha256_file,
    to_json,
    written_files,
)
from nsc_prune._validation import is_int, must_be
from nsc_prune._warn import say_held_warnings
from nsc_prune.choices import TRAIN_SELECTIONS
from nsc_prune.core.front import SearchSpace
from nsc_prune.core.spec import (
    PER_LAYER_HEADS_KEY,
    PER_LAYER_KEY,
    layer_lora_targets,
    lora_module_names,
    refuse_kv_cuts,
)
from nsc_prune.errors import ConfigError, InvalidInputError, StoppedRun, require
from nsc_prune.hf.cut.keep import LayerOrder
from nsc_prune.hf.cut.selection import (
    MIN_CALIB_TOKENS,
    activation_orders_from_ids,
    adapter_channel_orders,
    channel_order_document,
    magnitude_orders,
)
from nsc_prune.hf.model_card import copy_licence_files, supernet_card
from nsc_prune.hf.progress import quiet
from nsc_prune.hf.random_state import keeps_random_state
from nsc_prune.hf.ranks import launcher_rank
from nsc_prune.hf.train.data import HF_PREFIX, TextData, check_outside_datasets
from nsc_prune.hf.train.precision import precision_name
from nsc_prune.hf.train.resume import CHECKPOINTS_DIR
from nsc_prune.hf.train.subnets import (
    BaseTeacher,
    LayerChoices,
    SubnetSampler,
    check_elastic_kind,
    lora_ranks_of,
    pareto_points,
    space_choices,
    subnet_contexts,
)
from nsc_prune.hf.weights.adapter import peft_wrapping
from nsc_prune.hf.weights.base import BaseModel, open_base
from nsc_prune.hf.weights.fingerprint import weights_fingerprint
from nsc_prune.hf.weights.loading import check_trainable, from_pretrained, load_tokenizer
from nsc_prune.plan import ParetoDocument, pareto_path
from nsc_prune.spaces.lonas import comparable, fixed_rank_modules

torch = require("torch", "hf")

CALIB_TOKENS = 4096  # training tokens the activation order is computed on (selection's default)
STATE_NAMES = (CHECKPOINTS_DIR, CHANNEL_ORDER_NAME)  # what the training state folder holds (removed after)


# ---------------------------------------------------------------------------------------------- orders


def train_orders(base: BaseModel, method: str, blocks: Any, seq_len: int) -> tuple[list[LayerOrder], dict[str, Any]]:
    """The channel orders ``method`` gives: ``activation`` over the first ``CALIB_TOKENS`` training tokens,
    or ``magnitude`` (data-free); and the record for provenance."""
    if method not in TRAIN_SELECTIONS:
        raise InvalidInputError(must_be("--selection", f"one of {TRAIN_SELECTIONS}", method))
    if method == "magnitude":
        return magnitude_orders(base), {"method": method}
    ids = _flat_ids(blocks.train)[:CALIB_TOKENS]
    if len(ids) < MIN_CALIB_TOKENS:  # as extract and the search refuse a --calib this short
        raise InvalidInputError(
            f"--selection activation ranks channels on the first training tokens, and the training text has only "
            f"{len(ids)}; calibration needs at least {MIN_CALIB_TOKENS}: pass more text, or --selection magnitude"
        )
    return activation_orders_from_ids(base, ids, seq_len), {
        "method": method,
        "calib": "training data",
        "calib_tokens": len(ids),
    }


def _flat_ids(blocks: Any) -> torch.Tensor:
    if isinstance(blocks, torch.Tensor):
        return blocks.reshape(-1).long()
    return torch.cat([torch.as_tensor(b).reshape(-1) for b in blocks]).long()


# ---------------------------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class SupernetRequest:
    """One ``train-supernet`` run (the CLI's flags)."""

    base: str | Path
    space: str
    # a file or files, or files with --text-field / --val-fraction / --max-tokens (TextData)
    data: TextData | str | os.PathLike | Sequence[str | os.PathLike]
    out: str | Path
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # --set: space keys and TrainConfig keys
    pareto: str | Path | None = None
    selection: str = "activation"
    sandwich_random: int = 2
    distill: bool | None = None
    max_steps: int | None = None
    seq_len: int | None = None
    resume: bool = False
    overwrite: bool = False  # replace an existing super-adapter folder (one with nsc_prune_supernet.json)
    progress: bool = True
    work_dir: str | Path | None = None  # the training state folder (default: state_dir(out))
    budget: Any = None  # --minutes: a nsc_prune.hf.train.budget.TimeBudget sizing max_steps and the warm-up


def state_dir(out: Path, work_dir: str | Path | None = None) -> Path:
    """Where the training checkpoints of ``out`` live until it is written (kept on failure for --resume):
    ``work_dir`` (--work-dir), else ``.OUT.train`` beside ``out``."""
    out = Path(out).absolute()  # "." has no name to put a sibling beside
    return Path(work_dir) if work_dir is not None else out.parent / f".{out.name}.train"


def check_out(out: Path, inputs: Sequence[Any], overwrite: bool = False) -> None:
    """``check_output`` for a super-adapter folder: an existing one is replaced only with ``overwrite``, and only
    when it is empty or a super-adapter train-supernet wrote; an ``out`` that is or holds an input is refused."""
    from nsc_prune._io import check_output

    check_output(
        out,
        inputs,
        overwrite,
        marker=SUPERNET_RECORD_NAME,
        owner="a super-adapter written by nsc-prune train-supernet",
    )


def split_settings(settings: Mapping[str, Any], config_class: type) -> tuple[dict[str, Any], dict[str, Any]]:
    """(space overrides, training overrides): keys that are fields of ``config_class`` (TrainConfig) train."""
    fields = {f.name for f in dataclasses.fields(config_class)}
    return {k: v for k, v in settings.items() if k not in fields}, {k: v for k, v in settings.items() if k in fields}


def _space(
    request: SupernetRequest,
    base: BaseModel,
    overrides: dict[str, Any],
    train_keys: Sequence[str],
    train: Mapping[str, Any],
) -> SearchSpace:
    from nsc_prune.spaces.registry import build_space, load_space_yaml

    name, data = load_space_yaml(request.space)
    check_elastic_kind(name, data.get("kind"))  # before building for the base: a NAS space said "drop --model"
    if data.get("kind") == "lonas":  # the adapter's r and alpha are the space's: its ranks are r + rank_deltas
        overrides = {**overrides, **{k: train[k] for k in ("lora_rank", "lora_alpha") if k in train}}
    try:
        return build_space(request.space, base.config, **overrides)
    except ConfigError as err:
        if "has no setting" in str(err):
            close = sorted({m for key in overrides for m in difflib.get_close_matches(key, list(train_keys), n=1)})
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"{err}; or a training setting: {', '.join(sorted(train_keys))}{hint}") from err
        raise


def _recipe(request: SupernetRequest, space: SearchSpace, train: dict[str, Any], config_class: type) -> Any:
    """The TrainConfig: flags > --set > the lonas space's r / alpha / targets > TrainConfig defaults."""
    settings = dict(space.settings or {})
    if settings.get("kind") == "lonas":
        train.setdefault("lora_rank", settings["lora_rank"])
        train.setdefault("lora_alpha", settings["lora_alpha"])
        train.setdefault(
            "lora_targets", tuple(settings["elastic_rank_modules"]) + tuple(settings["fixed_rank_modules"])
        )
    if train.get("full"):
        raise ConfigError(
            must_be("full", "false for train-supernet", train["full"], "it trains a LoRA super-adapter on the base")
        )
    # Checkpointing recomputes the forward during backward, after the subnet contexts have exited: the
    # recomputation would run the full network, so the gradients would be wrong. Off unless asked, and refused.
    train.setdefault("gradient_checkpointing", False)
    if train["gradient_checkpointing"] is not False:
        raise ConfigError(
            must_be(
                "gradient_checkpointing",
                "false for train-supernet",
                train["gradient_checkpointing"],
                "Subnet masks are not active when checkpointing recomputes the forward",
            )
        )
    for key in ("max_steps", "seq_len", "distill"):
        if getattr(request, key) is not None:
            train[key] = getattr(request, key)
    try:
        return config_class.from_settings(train)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"training settings: {err}") from err


def _check_rank(rank: Any, choices: Sequence[LayerChoices]) -> None:
    ranks = lora_ranks_of(choices)
    if not is_int(rank) or rank < (max(ranks) if ranks else 1):
        needed = f">= {max(ranks)}, the largest rank of the space ({ranks})" if ranks else "a positive integer"
        raise ConfigError(
            must_be(
                "the adapter's LoRA rank (--set lora_rank)",
                needed,
                rank,
                "Raise --set lora_rank or lower the space's lora_rank",
            )
        )


def _check_front_space(front: Mapping[str, Any] | None, space: SearchSpace) -> None:
    """ConfigError when ``--pareto``'s front was searched on another kind of space, or on a lonas space of another
    rank, than ``--space``: the adapter's record names ``--space``, which the search then builds its subnets from,
    and extraction of the front keeps a lonas space's fixed modules at the front's rank."""
    settings = space.settings or {}
    if front is None or "kind" not in front:  # a front written by hand: its plans are checked one by one
        return
    for key in ("kind", "lora_rank", "rank_deltas", "fixed_rank_modules"):
        if key in front and key in settings and comparable(key, front[key]) != comparable(key, settings[key]):
            raise ConfigError(
                f"--pareto's front was searched with {key} {front[key]!r} and --space {space.name!r} has "
                f"{settings[key]!r}; pass the space (and --set) the front was searched with"
            )


def _check_targets(targets: Sequence[str], base: BaseModel, space: SearchSpace) -> None:
    """ConfigError unless every LoRA target is a decoder projection of the base (``lora_module_names``): extraction
    and the search slice those alone, so an adapter on another module (``lm_head``) could not be used. Under the
    lonas space, unless the targets are its modules: the ranks it samples are theirs, so a super-adapter on other
    modules would train none of them (and the search, reading the adapter, would see another space)."""
    model_type = base.config.get("model_type")
    mapped, outside = layer_lora_targets(targets, model_type)
    if outside:
        names = ", ".join(lora_module_names(model_type))
        raise ConfigError(must_be("lora_targets", f"decoder projections of a {model_type} layer ({names})", outside))
    settings = space.settings or {}
    if settings.get("kind") != "lonas":
        return
    modules = layer_lora_targets((*settings["elastic_rank_modules"], *settings["fixed_rank_modules"]), model_type)[0]
    if set(mapped) != set(modules):
        raise ConfigError(
            must_be(
                "lora_targets",
                f"the lonas space's LoRA modules ({', '.join(modules)})",
                list(targets),
                "To adapt others, set the space's elastic_rank_modules and fixed_rank_modules instead",
            )
        )


def _peft_model(base: BaseModel, config: Any) -> Any:
    from nsc_prune.hf.train.trainer import lora_config_for

    transformers, peft = require("transformers", "hf"), require("peft", "hf")
    torch.manual_seed(config.seed)
    model = from_pretrained(transformers.AutoModelForCausalLM, base.folder, dtype=torch.float32, use_safetensors=True)
    check_trainable(model, f"--base {base.folder}")
    # the model's own names (Phi-3: qkv_proj, gate_up_proj); one line for a module it lacks, not PEFT's traceback
    lora = lora_config_for(model, config)
    with peft_wrapping():
        return peft.get_peft_model(model, lora)


def _orders_for(
    request: SupernetRequest, base: BaseModel, blocks: Any, seq_len: int, state: Path
) -> tuple[list[LayerOrder], dict[str, Any]]:
    """The orders of a resumed run are the stored ones (the LoRA was trained in them)."""
    if request.resume and (state / CHANNEL_ORDER_NAME).is_file():
        orders, record = adapter_channel_orders(state, base)
        return orders, dict(record.get("trained_with") or {})
    orders, record = train_orders(base, request.selection, blocks, seq_len)
    state.mkdir(parents=True, exist_ok=True)
    atomic_write_text(state / CHANNEL_ORDER_NAME, to_json(channel_order_document(orders, base, record)))
    return orders, record


def _check_request(request: SupernetRequest, out: Path, data: TextData) -> None:
    """The checks on the request itself: a plain data-parallel launch, --out free of the inputs, no stale state
    folder, a known selection."""
    from nsc_prune._io import check_outside, check_work_dir
    from nsc_prune.hf.train.launch import refuse_sharded_launch

    refuse_sharded_launch("train-supernet")
    inputs = (request.base, *(f for f in data.files if not f.startswith(HF_PREFIX)), request.pareto)
    check_out(out, inputs, request.overwrite)
    check_outside(out, (request.base,))
    state = state_dir(out, request.work_dir)
    check_work_dir(state, (*inputs, out), own=STATE_NAMES)
    for folder, flag in ((out, "--out"), (state, "--work-dir")):
        check_outside_datasets(folder, data.files, flag)
    check_outside(state, (request.base,), "--work-dir")  # a stopped run would leave its state there
    if state.exists() and not request.resume:
        raise InvalidInputError(
            f"the training state folder {state} holds an earlier run; pass --resume to continue it, or remove the "
            "folder"
        )
    if request.selection not in TRAIN_SELECTIONS:
        raise InvalidInputError(must_be("--selection", f"one of {TRAIN_SELECTIONS}", request.selection))


def _train_in_state(
    request: SupernetRequest,
    base: BaseModel,
    blocks: Any,
    config: Any,
    sampler: SubnetSampler,
    state: Path,
    inputs: dict[str, Any],
    fixed_ranks: Mapping[str, int],
    made: Sequence[Path],
) -> tuple[Any, Any, dict[str, Any]]:
    """The channel orders and the training run in ``state`` (``inputs``: what a resume must start from again;
    ``fixed_ranks``: the LoRA every subnet keeps at a lonas space's rank); a fresh run that fails before its first
    checkpoint leaves nothing behind, not even the folders ``made`` above ``state``. Returns the model, the
    trainer's result and the orders' record."""
    from nsc_prune.hf.train.resume import removed_unless_resumable
    from nsc_prune.hf.train.trainer import train, untrained_loss

    with removed_unless_resumable(state, STATE_NAMES, made):
        say_held_warnings()  # the inputs are checked: their warnings come before the calibration pass, as in heal
        orders, order_record = _orders_for(request, base, blocks, config.seq_len, state)
        model = _peft_model(base, config)
        untrained_loss(model, blocks.train[:1], 1, f"--base {base.folder}")  # outputs that overflow: named, not "lr"
        teacher = BaseTeacher(model) if config.distill else None
        contexts = subnet_contexts(model, sampler, orders, fixed_ranks)
        result = train(
            model,
            blocks,
            config,
            state,
            teacher=teacher,
            subnet_contexts=contexts,
            resume=request.resume,
            progress=request.progress,
            budget=request.budget,
            inputs=inputs,
        )
    return model, result, order_record


@dataclass(frozen=True)
class _Run:
    """What a finished training run's record is written from."""

    request: SupernetRequest
    base: BaseModel
    space: SearchSpace
    sampler: SubnetSampler
    config: Any
    data: TextData
    blocks: Any
    order_record: dict[str, Any]
    result: Any
    start: float


def _supernet_record(run: _Run) -> dict[str, Any]:
    """The super-adapter's record (``SUPERNET_RECORD_NAME``): space, sampling, selection, recipe, data, tokens."""
    request, base, space, sampler, config = run.request, run.base, run.space, run.sampler, run.config
    data, blocks, order_record, result, start = run.data, run.blocks, run.order_record, run.result, run.start
    subnets = 2 + request.sandwich_random
    return {
        "space": {"name": space.name, "description": space.description, "settings": dict(space.settings or {})},
        "sampling": sampler.rule
        | (
            {"pareto": str(Path(request.pareto).resolve()), "pareto_sha256": sha256_file(pareto_path(request.pareto))}
            if request.pareto
            else {}
        ),
        "subnets_per_step": subnets,
        "selection": order_record,
        "recipe": result.recipe(config),
        "precision": precision_name(config),  # the recipe's bf16 "auto" as it resolved on this machine
        "data": {
            "files": [f if f.startswith(HF_PREFIX) else str(Path(f).resolve()) for f in data.files],
            **data.settings(),
            "sha256": blocks.sha256,
            "describe": blocks.describe(),
        },
        "token_budget": {
            "tokens_per_step": config.tokens_per_step * result.world_size,  # every process's, as "tokens" counts
            "steps": result.steps,
            "tokens": result.tokens,
            "subnet_forward_tokens": result.tokens * subnets,
        },
        "result": result.to_dict(),
        "wall_seconds": round(time.perf_counter() - start, 3),
        "provenance": provenance(
            base=str(base.folder.resolve()), base_config_sha256=sha256_file(base.folder / "config.json")
        ),
    }


@keeps_random_state
def train_supernet(request: SupernetRequest) -> Path:
    """Train a super-adapter (module docstring) and write it to ``request.out`` atomically; returns the folder.

    Every check runs before anything is written: an unusable space, rank, --pareto or --out raises
    (InvalidInputError / ConfigError) with nothing on disk. A second run naming the same state folder is refused
    while this one holds it."""
    out = Path(request.out)
    with claimed_work_dir(state_dir(out, request.work_dir)), quiet(not request.progress):
        return _train_supernet(request, out)  # one run at a time trains in (and removes) the state folder


def _train_supernet(request: SupernetRequest, out: Path) -> Path:
    """``train_supernet``, in the state folder this run holds."""
    from nsc_prune.hf.train.launch import check_ranks_agree
    from nsc_prune.hf.train.recipe import TrainConfig
    from nsc_prune.hf.train.resume import check_resume

    data = TextData.of(request.data)
    _check_request(request, out, data)
    base = open_base(request.base, job="train-supernet")
    if any(key in base.config for key in (PER_LAYER_KEY, PER_LAYER_HEADS_KEY)):  # transformers' stock class would fail
        raise ConfigError(
            f"--base {base.folder} is a pruned checkpoint (its layers differ in width); train-supernet trains on the "
            "dense model: pass the base it was extracted from"
        )
    space_keys, train_keys = split_settings(request.settings, TrainConfig)
    space = _space(request, base, space_keys, [f.name for f in dataclasses.fields(TrainConfig)], train_keys)
    choices = space_choices(space)
    refuse_kv_cuts(base.config.get("model_type"), [c.plans for c in choices], base.kv_heads, "train-supernet")
    config = _recipe(request, space, train_keys, TrainConfig)
    _check_rank(config.lora_rank, choices)
    _check_targets(config.lora_targets, base, space)
    config = config.for_model(base.config.get("max_position_embeddings"))
    points = pareto_points(request.pareto, base, config.lora_rank) if request.pareto else None
    front = ParetoDocument.read(pareto_path(request.pareto)).space if request.pareto else None
    _check_front_space(front, space)
    sampler = SubnetSampler(tuple(choices), request.sandwich_random, config.seed, points)
    tokenizer = load_tokenizer(base.folder, "the --base folder needs the model's tokenizer files")
    blocks = data.load(tokenizer, config.seq_len, config.seed)
    blocks.check_ids_fit(base.config["vocab_size"], base.folder)
    # (a collective: no rank goes on to create the state folder before every rank has checked it is absent)
    check_ranks_agree("train-supernet", blocks, config, base.folder)

    start = time.perf_counter()
    state = state_dir(out, request.work_dir)
    made = missing_parents(state)  # removed with the state folder where the run leaves them empty
    inputs = {
        "base": weights_fingerprint(base.folder, base.tensors),
        "space": {"name": space.name, "settings": dict(space.settings or {})},
        "selection": request.selection,
        "sandwich_random": request.sandwich_random,
        "pareto": sha256_file(pareto_path(request.pareto)) if request.pareto else None,
    }
    check_resume(state, config, blocks, config.distill, request.resume, request.budget, inputs)  # before the orders
    # the LoRA a lonas space holds at its rank, as it scores them (and extraction of its front keeps them)
    fixed = fixed_rank_modules(space.settings or {}, base.config.get("model_type"))
    model, result, order_record = _train_in_state(request, base, blocks, config, sampler, state, inputs, fixed, made)
    if result.interrupted:
        raise StoppedRun(result.steps, result.checkpoint, result.stopped_by)
    if launcher_rank() != 0:  # under a launcher rank 0 alone writes the adapter and then removes the state
        return out
    run = _Run(request, base, space, sampler, config, data, blocks, order_record, result, start)
    record = _supernet_record(run)
    replaceable = lambda found: check_out(found, (), True)  # noqa: E731
    with result.kept_on_stop(), atomic_dir(out, request.overwrite, replaceable, checked=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        _tidy_adapter_config(tmp, base)
        atomic_write_text(tmp / CHANNEL_ORDER_NAME, (state / CHANNEL_ORDER_NAME).read_text())
        atomic_write_text(tmp / "README.md", supernet_card(record, out.name, base.folder))  # not PEFT's blank one
        copy_licence_files(base.folder, tmp)
        files = written_files(tmp, SUPERNET_RECORD_NAME)  # what a later --overwrite may replace (check_output)
        atomic_write_text(tmp / SUPERNET_RECORD_NAME, to_json({**record, WRITTEN_FILES_KEY: files}))
        _check_written(tmp, base)
    remove_work_dir(state, STATE_NAMES, made)
    return out


def _tidy_adapter_config(folder: Path, base: BaseModel) -> None:
    """Name the modules (not a set's arbitrary order) and the base folder in adapter_config.json."""
    config = read_json_object(folder / ADAPTER_CONFIG_NAME)
    targets = config.get("target_modules")
    if isinstance(targets, list):
        config["target_modules"] = sorted(targets)
    config["base_model_name_or_path"] = str(base.folder.resolve())
    atomic_write_text(folder / ADAPTER_CONFIG_NAME, to_json(config))


def _check_written(folder: Path, base: BaseModel) -> None:
    """The adapter reads back as extraction and the search will read it (before the folder is published)."""
    from nsc_prune.hf.weights.adapter import check_adapter_fits, open_adapter
    from nsc_prune.spaces.lonas import read_adapter_config

    if not (folder / ADAPTER_WEIGHTS_NAME).is_file():
        raise ConfigError(f"PEFT wrote no {ADAPTER_WEIGHTS_NAME} in {folder}; is peft too old to write safetensors?")
    check_adapter_fits(open_adapter(folder), base.shapes(), base.num_layers)
    read_adapter_config(folder, base.config.get("model_type"))
    adapter_channel_orders(folder, base)


# Public names this module had before it was split by job: they resolve, with a DeprecationWarning, for one release.
__getattr__ = forward_moved(
    __name__,
    {
        "ELASTIC_KINDS": "nsc_prune.hf.train.subnets",
        "Plan": "nsc_prune.hf.train.subnets",
        "decoder_of": "nsc_prune.hf.train.subnets",
        "subnet_context": "nsc_prune.hf.train.subnets",
        "suspended_masks": "nsc_prune.hf.train.subnets",
    },
)

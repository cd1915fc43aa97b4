"""Super-adapter training: one PEFT LoRA adapter that serves every point of an elastic space.

Channel order first. The base's FFN channels and KV groups are ranked by importance (``activation`` on
the training text, or ``magnitude``; ``nsc_prune.hf.cut.selection``) and the orders are stored in the adapter
folder (``CHANNEL_ORDER_NAME``). Nothing is permuted on disk: the LoRA tensors stay in the base's own
coordinates (so the adapter still loads with stock PEFT on the original base), and ``nsc-prune extract
--adapter`` picks the orders up and keeps ``order[:k]`` of base and LoRA alike (``nsc_prune.hf.cut.keep``).

Each training step runs several subnets (``subnet_context``): the sandwich rule (largest, smallest and
``n`` random plans of the space) or points drawn from a given front. A subnet masks exactly what
extraction cuts, with the same index sets (``layer_index``):

- FFN channels: the MLP runs on the kept channels ``order.ffn[:k]`` only (gate/up rows, down columns, LoRA
  ``B`` rows / ``A`` columns alike), so a narrow subnet also costs less;
- KV groups outside ``order.kv_groups[:g]``: the input of ``o_proj`` over their query heads is zeroed
  (a head reaches the residual stream only through those columns);
- LoRA ranks beyond ``r`` (``plan.lora_rank``, every module of the layer, as extraction does): the output
  of ``lora_A`` beyond ``r`` is zeroed (scaling stays ``alpha / r_max``);
- a dropped layer returns its input (the residual stream) without computing anything.

The teacher of ``--teacher base`` is the same model with the adapter disabled and no mask (``BaseTeacher``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import random
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsc_prune._files import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, CHANNEL_ORDER_NAME, SUPERNET_RECORD_NAME
from nsc_prune._io import atomic_dir, atomic_write_text, provenance, read_json_object, sha256_file, to_json
from nsc_prune._validation import is_int, must_be
from nsc_prune.choices import TRAIN_SELECTIONS
from nsc_prune.core.front import SearchSpace, option_plans
from nsc_prune.core.spec import config_head_dim, config_kv_heads, refuse_kv_cuts
from nsc_prune.errors import ConfigError, InvalidInputError, NSCError, require
from nsc_prune.hf.cut.keep import LayerOrder, check_plan_fits, identity_orders, layer_index, plan_rank
from nsc_prune.hf.cut.selection import (
    activation_orders_from_ids,
    adapter_channel_orders,
    channel_order_document,
    magnitude_orders,
)
from nsc_prune.hf.ranks import launcher_rank
from nsc_prune.hf.train.data import HF_PREFIX, TextData
from nsc_prune.hf.weights.adapter import peft_wrapping
from nsc_prune.hf.weights.base import BaseModel, open_base
from nsc_prune.hf.weights.loading import from_pretrained
from nsc_prune.plan import LayerPlan, ParetoDocument, check_same_model, pareto_path

torch = require("torch", "hf")

ELASTIC_KINDS = ("lonas", "elastic")
CALIB_TOKENS = 4096  # training tokens the activation order is computed on (selection's default)
Plan = list[LayerPlan]

# ---------------------------------------------------------------------------------------------- space


@dataclass(frozen=True)
class LayerChoices:
    """The plans one layer of the space allows, each with its parameter count."""

    plans: tuple[LayerPlan, ...]
    params: tuple[int, ...]

    @property
    def largest(self) -> LayerPlan:
        return self.plans[max(range(len(self.plans)), key=lambda j: (self.params[j], -j))]

    @property
    def smallest(self) -> LayerPlan:
        return self.plans[min(range(len(self.plans)), key=lambda j: (self.params[j], j))]


def space_choices(space: SearchSpace) -> list[LayerChoices]:
    """Per layer the plans of an elastic space; ConfigError when no layer has a choice (nothing to train)."""
    settings = dict(space.settings or {})
    if settings.get("kind") not in ELASTIC_KINDS or len(space.subspaces) != 1:
        raise ConfigError(
            must_be(
                "--space",
                f"a space over a base model's layers (kind {' or '.join(ELASTIC_KINDS)})",
                f"{space.name} (kind {settings.get('kind')})",
                "e.g. --space ffn-grid, ffn-heads or lonas",
            )
        )
    if settings.get("homogeneous"):
        raise ConfigError(
            "homogeneous=true restricts the search, not the subnets train-supernet samples (each layer on its own); "
            "train without it and search the trained space with --set homogeneous=true"
        )
    layers = [
        LayerChoices(tuple(plans), tuple(int(option.params) for option in options))
        for plans, options in zip(option_plans(space, "--space"), space.subspaces[0].layers)
    ]
    if all(len(set(layer.plans)) < 2 for layer in layers):
        raise ConfigError(
            must_be(
                f"space {space.name!r}",
                "a space with an elastic axis (a layer with two or more options)",
                space.description,
                "Lower ffn_min_fraction, enable kv_heads or depth, or add rank_deltas",
            )
        )
    return layers


def lora_ranks_of(choices: Sequence[LayerChoices]) -> list[int]:
    """Every explicit LoRA rank the space's plans ask for (empty when they all keep the full rank)."""
    return sorted({p.lora_rank for layer in choices for p in layer.plans if p.lora_rank is not None})


# ---------------------------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class SubnetSampler:
    """Which subnets a step trains: the sandwich rule over the space (largest, smallest, ``n_random`` random
    plans), or, with ``points``, the largest and smallest point of a front and ``n_random`` random points."""

    choices: tuple[LayerChoices, ...]
    n_random: int = 2
    seed: int = 0
    points: tuple[tuple[LayerPlan, ...], ...] | None = None  # from --pareto, sorted by params

    def __post_init__(self) -> None:
        if not is_int(self.n_random) or self.n_random < 0:
            raise InvalidInputError(must_be("--sandwich-random", "an integer >= 0", self.n_random))

    @property
    def rule(self) -> dict[str, Any]:
        if self.points is None:
            return {"rule": "sandwich", "random": self.n_random, "seed": self.seed}
        return {"rule": "pareto", "random": self.n_random, "seed": self.seed, "points": len(self.points)}

    def largest(self) -> Plan:
        return list(self.points[-1]) if self.points else [layer.largest for layer in self.choices]

    def smallest(self) -> Plan:
        return list(self.points[0]) if self.points else [layer.smallest for layer in self.choices]

    def plans(self, step: int) -> list[Plan]:
        """The subnets of ``step``, deterministic in (seed, step) so a resumed run draws the same ones."""
        rng = random.Random(self.seed * 1_000_003 + step)
        if self.points:
            drawn = [list(self.points[rng.randrange(len(self.points))]) for _ in range(self.n_random)]
        else:
            drawn = [
                [layer.plans[rng.randrange(len(layer.plans))] for layer in self.choices] for _ in range(self.n_random)
            ]
        return [self.largest(), self.smallest(), *drawn]


def pareto_points(path: str | Path, base: BaseModel, rank: int) -> tuple[tuple[LayerPlan, ...], ...]:
    """The plans of a pareto.json, cheapest first, checked against the base and the adapter rank."""
    document = ParetoDocument.read(pareto_path(path))
    check_same_model(document.model_config, base.config)
    points = []
    for point in sorted(document.points, key=lambda p: p.params):
        plans = point.layer_plans()
        check_plan_fits(plans, base.widths, base.kv_heads, None)
        too_big = [p.lora_rank for p in plans if p.lora_rank is not None and p.lora_rank > rank]
        if too_big:
            raise ConfigError(
                must_be("the LoRA rank (--set lora_rank)", f">= every rank the front asks for ({max(too_big)})", rank)
            )
        points.append(tuple(plans))
    return tuple(points)


# ---------------------------------------------------------------------------------------------- masks

_SUSPENDED = [0]  # > 0 while BaseTeacher runs: every subnet mask passes through


@contextlib.contextmanager
def suspended_masks() -> Iterator[None]:
    """Run the full network while a subnet context is active (the teacher's forward)."""
    _SUSPENDED[0] += 1
    try:
        yield
    finally:
        _SUSPENDED[0] -= 1


def decoder_of(model: Any) -> tuple[Any, Mapping[str, Any]]:
    """(the decoder layers, the config dict) of a causal LM, PEFT-wrapped or not."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.model.layers, inner.config.to_dict()


def _mask(index: Any, full: int, like: torch.Tensor) -> torch.Tensor | None:
    """A 0/1 vector over ``full`` units keeping the ``nsc_prune.hf.cut.keep.Index`` set ``index`` (None: all kept)."""
    if index is None:
        return None
    mask = torch.zeros(full, dtype=like.dtype, device=like.device)
    mask[slice(0, index) if isinstance(index, int) else list(index)] = 1
    return mask


def _input_mask(mask: torch.Tensor) -> Callable[..., Any]:
    def hook(module: Any, args: tuple[Any, ...]) -> Any:
        return None if _SUSPENDED[0] else (args[0] * mask.to(args[0].dtype), *args[1:])

    return hook


def _output_mask(mask: torch.Tensor) -> Callable[..., Any]:
    def hook(module: Any, args: tuple[Any, ...], output: torch.Tensor) -> Any:
        return None if _SUSPENDED[0] else output * mask.to(output.dtype)

    return hook


def _skip(layer: Any) -> Callable[..., Any]:
    full = type(layer).forward

    def forward(hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
        return full(layer, hidden_states, *args, **kwargs) if _SUSPENDED[0] else hidden_states

    return forward


def _index_tensor(index: Any, device: Any) -> slice | torch.Tensor:
    return slice(0, index) if isinstance(index, int) else torch.tensor(index, dtype=torch.long, device=device)


def _narrow_linear(module: Any, x: torch.Tensor, plan: LayerPlan, rows: Any = None, cols: Any = None) -> torch.Tensor:
    """``module(x)`` with only the ``rows`` (outputs) / ``cols`` (inputs) of its weight, its LoRA cut alike and to
    the plan's rank (``A[:r, cols]``, ``B[rows, :r]``, scaling unchanged): the extracted layer's arithmetic."""
    base = getattr(module, "base_layer", module)
    weight, bias = base.weight, base.bias
    if rows is not None:
        weight, bias = weight[rows], bias[rows] if bias is not None else None
    if cols is not None:
        weight = weight[:, cols]
    out = torch.nn.functional.linear(x, weight, bias)
    if not hasattr(module, "lora_A") or module.disable_adapters or module.merged:
        return out
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        a, b = module.lora_A[name].weight, module.lora_B[name].weight
        rank = plan_rank(plan, a.shape[0])
        a, b = a[:rank], b[:, :rank]
        a = a[:, cols] if cols is not None else a
        b = b[rows] if rows is not None else b
        lora = torch.nn.functional.linear(torch.nn.functional.linear(module.lora_dropout[name](x), a), b)
        out = out + lora * module.scaling[name]
    return out


def _narrow_mlp(mlp: Any, index: Any, plan: LayerPlan) -> Callable[..., Any]:
    """A gated MLP forward over the kept channels ``index`` only (gate/up rows, down columns; Phi-3's fused
    gate_up_proj: the kept gate rows and the same channels' up rows)."""
    full = type(mlp).forward
    fused = hasattr(mlp, "gate_up_proj")
    if fused:
        channels = torch.arange(_in_features(mlp.down_proj), device=mlp.down_proj.weight.device)[index]
        gate_up = torch.cat([channels, channels + _in_features(mlp.down_proj)])

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if _SUSPENDED[0]:
            return full(mlp, x, *args, **kwargs)
        if fused:
            gate, up = _narrow_linear(mlp.gate_up_proj, x, plan, rows=gate_up).chunk(2, dim=-1)
            hidden = mlp.activation_fn(gate) * up
        else:
            gate = _narrow_linear(mlp.gate_proj, x, plan, rows=index)
            hidden = mlp.act_fn(gate) * _narrow_linear(mlp.up_proj, x, plan, rows=index)
        return _narrow_linear(mlp.down_proj, hidden, plan, cols=index)

    return forward


def _lora_modules(layer: Any) -> Iterator[Any]:
    """Every ``lora_A`` linear of a decoder layer (one per adapted projection and adapter name)."""
    for module in layer.modules():
        lora_a = getattr(module, "lora_A", None)
        if isinstance(lora_a, torch.nn.ModuleDict):
            yield from lora_a.values()


@contextlib.contextmanager
def subnet_context(
    model: Any, plans: Sequence[LayerPlan], orders: Sequence[LayerOrder] | None = None
) -> Iterator[None]:
    """Within the block ``model`` computes the subnet ``plans`` (module docstring): what extraction of ``plans``
    with ``orders`` (None: identity, the LoNAS convention) keeps. Hooks are removed on exit."""
    layers, config = decoder_of(model)
    if len(plans) != len(layers):
        raise ConfigError(f"the plan has {len(plans)} layers but the model has {len(layers)}")
    heads, kv_total, head_dim = int(config["num_attention_heads"]), config_kv_heads(config), config_head_dim(config)
    handles, replaced = [], []
    try:
        for i, (layer, plan) in enumerate(zip(layers, plans, strict=True)):
            if not plan.keep:
                layer.forward = _skip(layer)
                replaced.append(layer)
                continue
            down, o_proj = layer.mlp.down_proj, layer.self_attn.o_proj
            width, q_rows = _in_features(down), _in_features(o_proj)
            order = (
                orders[i]
                if orders is not None
                else identity_orders((width,), (q_rows // head_dim // (heads // kv_total),))[0]
            )
            index = layer_index(plan, order, heads // kv_total, head_dim)
            like = next(layer.parameters())
            if index.ffn is not None:  # computed on the kept channels only: a narrow subnet costs less
                layer.mlp.forward = _narrow_mlp(layer.mlp, _index_tensor(index.ffn, like.device), plan)
                replaced.append(layer.mlp)
            mask = _mask(index.q, q_rows, like)
            if mask is not None:
                handles.append(o_proj.register_forward_pre_hook(_input_mask(mask)))
            for lora_a in _lora_modules(layer):
                rank = plan_rank(plan, lora_a.out_features)
                if rank < lora_a.out_features:
                    handles.append(lora_a.register_forward_hook(_output_mask(_mask(rank, lora_a.out_features, like))))
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module in replaced:
            del module.forward


def _in_features(module: Any) -> int:
    return int(getattr(module, "base_layer", module).in_features)


class BaseTeacher:
    """The full base model for distillation: the student itself with its adapter disabled and no subnet mask
    (``peft``'s ``disable_adapter``), so no second copy of the weights. Call it like the model."""

    def __init__(self, model: Any) -> None:
        self._model = model  # not a registered submodule: .eval()/.to() on the teacher leave the student alone

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with suspended_masks(), self._model.disable_adapter(), torch.no_grad():
            return self._model(*args, **kwargs)

    forward = __call__

    def eval(self) -> BaseTeacher:
        return self

    def train(self, mode: bool = True) -> BaseTeacher:
        return self

    def to(self, *args: Any, **kwargs: Any) -> BaseTeacher:
        return self

    def requires_grad_(self, requires_grad: bool = True) -> BaseTeacher:
        return self

    def parameters(self) -> Iterator[Any]:
        return iter(())

    @property
    def device(self) -> Any:
        return self._model.device

    @property
    def config(self) -> Any:
        return self._model.config


def subnet_contexts(
    model: Any, sampler: SubnetSampler, orders: Sequence[LayerOrder] | None
) -> Callable[[int], list[AbstractContextManager]]:
    """``step -> [subnet_context for each plan the sampler draws]``, the trainer's ``subnet_contexts``."""
    return lambda step: [subnet_context(model, plans, orders) for plans in sampler.plans(step)]


# ---------------------------------------------------------------------------------------------- orders


def train_orders(base: BaseModel, method: str, blocks: Any, seq_len: int) -> tuple[list[LayerOrder], dict[str, Any]]:
    """The channel orders ``method`` gives: ``activation`` over the first ``CALIB_TOKENS`` training tokens,
    or ``magnitude`` (data-free); and the record for provenance."""
    if method not in TRAIN_SELECTIONS:
        raise InvalidInputError(must_be("--selection", f"one of {TRAIN_SELECTIONS}", method))
    if method == "magnitude":
        return magnitude_orders(base), {"method": method}
    ids = _flat_ids(blocks.train)[:CALIB_TOKENS]
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
    data: TextData | Sequence[str]  # files, or files with --text-field / --val-fraction / --max-tokens
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
    request: SupernetRequest, base: BaseModel, overrides: dict[str, Any], train_keys: Sequence[str]
) -> SearchSpace:
    from nsc_prune.spaces.registry import build_space

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


def _peft_model(base: BaseModel, config: Any) -> Any:
    from nsc_prune.hf.train.trainer import lora_targets_of

    transformers, peft = require("transformers", "hf"), require("peft", "hf")
    torch.manual_seed(config.seed)
    model = from_pretrained(transformers.AutoModelForCausalLM, base.folder, dtype=torch.float32, use_safetensors=True)
    # the model's own names (Phi-3: qkv_proj, gate_up_proj); one line for a module it lacks, not PEFT's traceback
    targets = lora_targets_of(model, config.lora_targets)
    lora = peft.LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        target_modules=list(targets),
        lora_dropout=float(getattr(config, "lora_dropout", 0.0)),
        bias="none",
        task_type="CAUSAL_LM",
    )
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
    from nsc_prune._io import check_work_dir
    from nsc_prune.hf.train.launch import refuse_sharded_launch
    from nsc_prune.hf.train.resume import CHECKPOINTS_DIR

    refuse_sharded_launch("train-supernet")
    inputs = (request.base, *(f for f in data.files if not f.startswith(HF_PREFIX)), request.pareto)
    check_out(out, inputs, request.overwrite)
    state = state_dir(out, request.work_dir)
    check_work_dir(state, (*inputs, out), own=(CHECKPOINTS_DIR, CHANNEL_ORDER_NAME))
    if state.exists() and not request.resume:
        raise InvalidInputError(
            must_be(
                f"the training state folder {state}",
                "absent for a fresh run",
                "present",
                "Pass --resume to continue that run, or remove the folder",
            )
        )
    if request.selection not in TRAIN_SELECTIONS:
        raise InvalidInputError(must_be("--selection", f"one of {TRAIN_SELECTIONS}", request.selection))


def _train_in_state(
    request: SupernetRequest, base: BaseModel, blocks: Any, config: Any, sampler: SubnetSampler, state: Path
) -> tuple[Any, Any, dict[str, Any]]:
    """The channel orders and the training run in ``state``; a fresh run that fails before its first checkpoint
    leaves nothing behind. Returns the model, the trainer's result and the orders' record."""
    from nsc_prune.hf.train.resume import CHECKPOINTS_DIR
    from nsc_prune.hf.train.trainer import train

    fresh = not state.exists()
    try:
        orders, order_record = _orders_for(request, base, blocks, config.seq_len, state)
        model = _peft_model(base, config)
        teacher = BaseTeacher(model) if config.distill else None
        contexts = subnet_contexts(model, sampler, orders)
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
        )
    except BaseException:
        if fresh and not any(state.glob(f"{CHECKPOINTS_DIR}/checkpoint-*")):
            shutil.rmtree(state, ignore_errors=True)  # nothing to resume: leave nothing behind
        raise
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
        "data": {
            "files": [f if f.startswith(HF_PREFIX) else str(Path(f).resolve()) for f in data.files],
            "text_field": data.text_field,
            "val_fraction": data.val_fraction,
            "max_tokens": data.max_tokens,
            "sha256": blocks.sha256,
            "describe": blocks.describe(),
        },
        "token_budget": {
            "tokens_per_step": config.tokens_per_step,
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


def train_supernet(request: SupernetRequest) -> Path:
    """Train a super-adapter (module docstring) and write it to ``request.out`` atomically; returns the folder.

    Every check runs before anything is written: an unusable space, rank, --pareto or --out raises
    (InvalidInputError / ConfigError) with nothing on disk."""
    from nsc_prune.hf.train.launch import check_ranks_agree
    from nsc_prune.hf.train.recipe import TrainConfig

    out = Path(request.out)
    data = TextData.of(request.data)
    _check_request(request, out, data)
    base = open_base(request.base, job="train-supernet")
    space_keys, train_keys = split_settings(request.settings, TrainConfig)
    space = _space(request, base, space_keys, [f.name for f in dataclasses.fields(TrainConfig)])
    choices = space_choices(space)
    refuse_kv_cuts(base.config.get("model_type"), [c.plans for c in choices], base.kv_heads, "train-supernet")
    config = _recipe(request, space, train_keys, TrainConfig)
    _check_rank(config.lora_rank, choices)
    config = config.for_model(base.config.get("max_position_embeddings"))
    points = pareto_points(request.pareto, base, config.lora_rank) if request.pareto else None
    sampler = SubnetSampler(tuple(choices), request.sandwich_random, config.seed, points)
    tokenizer = require("transformers", "hf").AutoTokenizer.from_pretrained(base.folder)
    blocks = data.load(tokenizer, config.seq_len, config.seed)
    # (a collective: no rank goes on to create the state folder before every rank has checked it is absent)
    check_ranks_agree("train-supernet", blocks, config, base.folder)

    start = time.perf_counter()
    state = state_dir(out, request.work_dir)
    model, result, order_record = _train_in_state(request, base, blocks, config, sampler, state)
    if result.interrupted:
        raise NSCError(
            f"stopped by SIGTERM after step {result.steps}; the checkpoint is in {result.checkpoint}. "
            "Run the same command with --resume to continue"
        )
    if launcher_rank() != 0:  # under a launcher rank 0 alone writes the adapter and then removes the state
        return out
    run = _Run(request, base, space, sampler, config, data, blocks, order_record, result, start)
    record = _supernet_record(run)
    with atomic_dir(out, overwrite=out.exists()) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        _tidy_adapter_config(tmp, base)
        atomic_write_text(tmp / CHANNEL_ORDER_NAME, (state / CHANNEL_ORDER_NAME).read_text())
        atomic_write_text(tmp / SUPERNET_RECORD_NAME, to_json(record))
        _check_written(tmp, base)
    shutil.rmtree(state, ignore_errors=True)
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
    read_adapter_config(folder)
    adapter_channel_orders(folder, base)

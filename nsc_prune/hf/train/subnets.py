"""The subnets of a super-adapter: the plans an elastic space allows each layer (``space_choices``), the ones a
training step runs (``SubnetSampler``: the sandwich rule, or points of a front), and one subnet run inside the full
PEFT model (``subnet_context``). A subnet masks exactly what extraction cuts, with the same index sets
(``layer_index``):

- FFN channels: the MLP runs on the kept channels ``order.ffn[:k]`` only (gate/up rows, down columns, LoRA
  ``B`` rows / ``A`` columns alike), so a narrow subnet also costs less;
- KV groups outside ``order.kv_groups[:g]``: the input of ``o_proj`` over their query heads is zeroed
  (a head reaches the residual stream only through those columns);
- LoRA ranks beyond ``r`` (``plan.lora_rank``, every module of the layer but a lonas space's
  ``fixed_rank_modules``, kept at its ``lora_rank``, as extraction does): the output of ``lora_A`` beyond ``r`` is
  zeroed (scaling stays ``alpha / r_max``);
- a dropped layer returns its input (the residual stream) without computing anything.

The teacher of ``--teacher base`` is the same model with the adapter disabled and no mask (``BaseTeacher``).
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsc_prune._validation import is_int, must_be
from nsc_prune.core.front import SearchSpace, option_plans
from nsc_prune.core.spec import config_head_dim, config_kv_heads, refuse_kv_cuts
from nsc_prune.errors import ConfigError, InvalidInputError, require
from nsc_prune.hf.cut.keep import LayerOrder, check_plan_fits, identity_orders, layer_index, plan_rank
from nsc_prune.hf.ranks import launched_processes
from nsc_prune.hf.weights.base import BaseModel
from nsc_prune.plan import LayerPlan, ParetoDocument, check_same_model, pareto_path

torch = require("torch", "hf")

ELASTIC_KINDS = ("lonas", "elastic")
Plan = list[LayerPlan]

# ---------------------------------------------------------------------------------------------- space


@dataclass(frozen=True)
class LayerChoices:
    """The plans one layer of the space allows, each with its parameter count."""

    plans: tuple[LayerPlan, ...]
    params: tuple[int, ...]

    @property
    def largest(self) -> LayerPlan:
        return self.plans[max(range(len(self.plans)), key=lambda j: (*self._size(j), -j))]

    @property
    def smallest(self) -> LayerPlan:
        return self.plans[min(range(len(self.plans)), key=lambda j: (*self._size(j), j))]

    def _size(self, j: int) -> tuple[int, int, int]:
        # Merged LoRA adds no parameters: plans of one width tie on params, and the rank breaks the tie (the
        # sandwich's smallest subnet trained the largest rank).
        plan = self.plans[j]
        return self.params[j], plan.lora_rank or 0, plan.kv_groups or 0


def check_elastic_kind(name: str, kind: Any, subspaces: int = 1) -> None:
    """ConfigError unless space ``name`` of ``kind`` is one space over a base model's layers (what train-supernet
    samples subnets of): checked on the YAML before the space is built for the base, and on the built space."""
    if kind not in ELASTIC_KINDS or subspaces != 1:
        raise ConfigError(
            must_be(
                "--space",
                f"a space over a base model's layers (kind {' or '.join(ELASTIC_KINDS)})",
                f"{name} (kind {kind})",
                "e.g. --space ffn-grid, ffn-heads or lonas",
            )
        )


def space_choices(space: SearchSpace) -> list[LayerChoices]:
    """Per layer the plans of an elastic space; ConfigError when no layer has a choice (nothing to train)."""
    settings = dict(space.settings or {})
    check_elastic_kind(space.name, settings.get("kind"), len(space.subspaces))
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
                "Lower ffn_step (--set ffn_step=N: the FFN grid's step, 256 by default) or ffn_min_fraction, enable "
                "kv_heads or depth, or add rank_deltas",
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
        count = len(self.points) if self.points else math.prod(len(layer.plans) for layer in self.choices)
        if self.n_random > count:  # each is a forward and backward pass a step: more than the space holds repeats
            where = "points in --pareto" if self.points else "architectures in the space"
            raise InvalidInputError(must_be("--sandwich-random", f"at most the {count} {where}", self.n_random))

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
    refuse_kv_cuts(base.config.get("model_type"), list(zip(*points)), base.kv_heads, "train-supernet --pareto")
    if launched_processes() > 1 and not all(plan.keep for plan in points[-1]):
        # The largest subnet runs last and its backward syncs the processes' gradients: a dropped layer's LoRA is
        # not in that graph, and DDP stops waiting for it.
        raise ConfigError(
            "--pareto's largest point drops a layer, which several processes cannot train (the last subnet of a "
            "step must use every weight); search a front that keeps the full model, or train in one process"
        )
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


def _narrow_linear(
    module: Any, x: torch.Tensor, rank_of: Callable[[int], int], rows: Any = None, cols: Any = None
) -> torch.Tensor:
    """``module(x)`` with only the ``rows`` (outputs) / ``cols`` (inputs) of its weight, its LoRA cut alike and to
    the kept rank (``rank_of(full rank)``: ``A[:r, cols]``, ``B[rows, :r]``, scaling unchanged): the extracted
    layer's arithmetic."""
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
        rank = rank_of(a.shape[0])
        a, b = a[:rank], b[:, :rank]
        a = a[:, cols] if cols is not None else a
        b = b[rows] if rows is not None else b
        lora = torch.nn.functional.linear(torch.nn.functional.linear(module.lora_dropout[name](x), a), b)
        out = out + lora * module.scaling[name]
    return out


def _narrow_mlp(mlp: Any, index: Any, plan: LayerPlan, fixed_ranks: Mapping[str, int] | None) -> Callable[..., Any]:
    """A gated MLP forward over the kept channels ``index`` only (gate/up rows, down columns; Phi-3's fused
    gate_up_proj: the kept gate rows and the same channels' up rows)."""

    def rank_of(name: str) -> Callable[[int], int]:
        return lambda full: plan_rank(plan, full, name, fixed_ranks)

    full = type(mlp).forward
    fused = hasattr(mlp, "gate_up_proj")
    if fused:
        channels = torch.arange(_in_features(mlp.down_proj), device=mlp.down_proj.weight.device)[index]
        gate_up = torch.cat([channels, channels + _in_features(mlp.down_proj)])

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if _SUSPENDED[0]:
            return full(mlp, x, *args, **kwargs)
        if fused:
            gate, up = _narrow_linear(mlp.gate_up_proj, x, rank_of("gate_up_proj"), rows=gate_up).chunk(2, dim=-1)
            hidden = mlp.activation_fn(gate) * up
        else:
            gate = _narrow_linear(mlp.gate_proj, x, rank_of("gate_proj"), rows=index)
            hidden = mlp.act_fn(gate) * _narrow_linear(mlp.up_proj, x, rank_of("up_proj"), rows=index)
        return _narrow_linear(mlp.down_proj, hidden, rank_of("down_proj"), cols=index)

    return forward


def _lora_modules(layer: Any) -> Iterator[tuple[str, Any]]:
    """Every ``lora_A`` linear of a decoder layer (one per adapted projection and adapter name), with the name of
    the projection it adapts (``mlp.down_proj``)."""
    for name, module in layer.named_modules():
        lora_a = getattr(module, "lora_A", None)
        if isinstance(lora_a, torch.nn.ModuleDict):
            yield from ((name, a) for a in lora_a.values())


@contextlib.contextmanager
def subnet_context(
    model: Any,
    plans: Sequence[LayerPlan],
    orders: Sequence[LayerOrder] | None = None,
    fixed_ranks: Mapping[str, int] | None = None,
) -> Iterator[None]:
    """Within the block ``model`` computes the subnet ``plans`` (module docstring): what extraction of ``plans``
    with ``orders`` (None: identity, the LoNAS convention) keeps, the LoRA of the ``fixed_ranks`` modules at theirs.
    Hooks are removed on exit."""
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
                layer.mlp.forward = _narrow_mlp(layer.mlp, _index_tensor(index.ffn, like.device), plan, fixed_ranks)
                replaced.append(layer.mlp)
            mask = _mask(index.q, q_rows, like)
            if mask is not None:
                handles.append(o_proj.register_forward_pre_hook(_input_mask(mask)))
            for name, lora_a in _lora_modules(layer):
                rank = plan_rank(plan, lora_a.out_features, name, fixed_ranks)
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
    model: Any,
    sampler: SubnetSampler,
    orders: Sequence[LayerOrder] | None,
    fixed_ranks: Mapping[str, int] | None = None,
) -> Callable[[int], list[AbstractContextManager]]:
    """``step -> [subnet_context for each plan the sampler draws]``, the trainer's ``subnet_contexts``."""
    return lambda step: [subnet_context(model, plans, orders, fixed_ranks) for plans in sampler.plans(step)]

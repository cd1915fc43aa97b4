"""A PEFT LoRA super-adapter read lazily (headers only) and the config of its sliced sub-adapter.

LoNAS convention: a sub-adapter keeps the first ``r`` ranks of every LoRA module, i.e. rows
``A[:r]`` and columns ``B[:, :r]``, and keeps the super-adapter's scaling ``alpha / r_max``. PEFT scales a
rank-``r`` module by ``alpha_r / r``, so the sub-adapter sets ``alpha_r = scaling * r`` per module in
``alpha_pattern`` next to its ``rank_pattern`` (setting only one would change the scaling).
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsc_prune._files import ADAPTER_WEIGHTS_NAME
from nsc_prune._validation import is_int, must_be
from nsc_prune.errors import ConfigError
from nsc_prune.hf.weights.safetensors_io import TensorInfo, read_header, refuse_pickles
from nsc_prune.spaces.lonas import PEFT_LORA_ALPHA, read_lora_config

PROJECTIONS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "self_attn.qkv_proj",
    "mlp.gate_up_proj",
)
_KEY = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn\.(?:[qkvo]|qkv)_proj|mlp\.(?:gate|up|down|gate_up)_proj)\.lora_([AB])\.weight$"
)

# peft 0.21 reads transformers' deprecated ``is_gradient_checkpointing`` property whenever it wraps a model
# (``PeftModel.__init__``), and transformers 5 answers with a FutureWarning on every wrap: peft's access, not ours,
# and nothing a user can act on. pyproject.toml filters the same message for the tests' own peft calls.
PEFT_DEPRECATION = "`is_gradient_checkpointing` is deprecated"


@contextlib.contextmanager
def peft_wrapping() -> Iterator[None]:
    """Within this block, peft's wrapping of a model does not print transformers' ``PEFT_DEPRECATION`` warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PEFT_DEPRECATION, category=FutureWarning)
        yield


@dataclass(frozen=True)
class LoraModule:
    """One LoRA pair on ``model.layers.{layer}.{module}``: ``a`` is r_max x in, ``b`` is out x r_max."""

    layer: int
    module: str
    a: TensorInfo
    b: TensorInfo
    scaling: float

    @property
    def rank(self) -> int:
        return self.a.shape[0]

    @property
    def path(self) -> str:
        return f"model.layers.{self.layer}.{self.module}"


@dataclass(frozen=True)
class LoraAdapter:
    """A PEFT LoRA super-adapter read from ``folder``: its ``adapter_config.json`` and each (layer, projection)
    pair of A and B tensors (headers only; values are streamed when a job merges them)."""

    folder: Path
    config: dict[str, Any]
    modules: dict[tuple[int, str], LoraModule]
    fixed_ranks: Mapping[str, int] = field(default_factory=dict)  # a lonas front's fixed_rank_modules -> its rank

    def layer_rank(self, layer: int) -> int | None:
        """The most a plan's ``lora_rank`` may keep in ``layer``: the smallest rank among its elastic modules (the
        ``fixed_ranks`` ones keep their own), 0 when the layer has no LoRA, None when all of it is fixed."""
        mine = [(name.rsplit(".", 1)[-1], m.rank) for (i, name), m in self.modules.items() if i == layer]
        elastic = [rank for name, rank in mine if name not in self.fixed_ranks]
        return min(elastic) if elastic else (None if mine else 0)


def _pattern_value(patterns: dict[str, Any], module_path: str, default: Any) -> Any:
    # PEFT's rule: a pattern key matches a module when the name ends with it at a dot boundary (regex allowed).
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module_path):
            return value
    return default


def open_adapter(folder: str | Path) -> LoraAdapter:
    """Read and check a PEFT LoRA adapter folder (config + safetensors header; no tensor data)."""
    folder = Path(folder)
    config = read_lora_config(folder)
    weights = folder / ADAPTER_WEIGHTS_NAME
    if not weights.is_file():
        refuse_pickles(folder, "adapter folder", expected=ADAPTER_WEIGHTS_NAME)
    tensors = read_header(weights)

    pairs: dict[tuple[int, str], dict[str, TensorInfo]] = {}
    for name, info in tensors.items():
        match = _KEY.match(name)
        if match is None:
            raise ConfigError(
                f"{weights} holds {name!r}; nsc-prune handles LoRA on the LLaMA decoder projections only "
                f"({', '.join(p.split('.')[1] for p in PROJECTIONS)})"
            )
        pairs.setdefault((int(match[1]), match[2]), {})[match[3]] = info
    alpha, r = config.get("lora_alpha", PEFT_LORA_ALPHA), config["r"]
    rank_pattern, alpha_pattern = config.get("rank_pattern") or {}, config.get("alpha_pattern") or {}
    modules = {}
    for (layer, module), pair in sorted(pairs.items()):
        path = f"model.layers.{layer}.{module}"
        if set(pair) != {"A", "B"}:
            raise ConfigError(
                f"{weights}: {path} has lora_{next(iter(pair))} but not its partner; the file is incomplete"
            )
        a, b = pair["A"], pair["B"]
        rank = _pattern_value(rank_pattern, path, r)
        if len(a.shape) != 2 or len(b.shape) != 2 or a.shape[0] != rank or b.shape[1] != rank:
            raise ConfigError(
                f"{weights}: {path} has lora_A {list(a.shape)} and lora_B {list(b.shape)}; expected rank {rank} "
                "from adapter_config.json"
            )
        module_alpha = _pattern_value(alpha_pattern, path, alpha)
        scale = module_alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
        modules[(layer, module)] = LoraModule(layer, module, a, b, float(scale))
    if not modules:
        raise ConfigError(f"{weights} holds no LoRA weights")
    _check_targeting(folder, config)
    ignored = [m.path for m in modules.values() if not _peft_adapts(config, m)]
    if ignored:
        more = f" and {len(ignored) - 1} more" if len(ignored) > 1 else ""
        raise ConfigError(
            f"{weights} holds LoRA weights for {ignored[0]}{more}, which its adapter_config.json's target_modules, "
            "exclude_modules and layers_to_transform do not adapt: PEFT would ignore them, and merging them would "
            "give another model. Make the config and the file agree"
        )
    return LoraAdapter(folder, config, modules)


def _check_targeting(folder: Path, config: dict[str, Any]) -> None:
    """ConfigError unless ``layers_to_transform``, ``target_modules`` and ``exclude_modules`` are of the types PEFT
    reads (a regex compiles)."""
    layers = config.get("layers_to_transform")
    if not (layers is None or is_int(layers) or (isinstance(layers, list) and all(map(is_int, layers)))):
        raise ConfigError(f"{folder}: {must_be('layers_to_transform', 'a layer index or a list of them', layers)}")
    for key in ("target_modules", "exclude_modules"):
        names = config.get(key)
        listed = isinstance(names, list) and all(isinstance(name, str) and name for name in names)
        if not (names is None or isinstance(names, str) or listed):
            raise ConfigError(f"{folder}: {must_be(key, 'a list of module names or a regex', names)}")
        if isinstance(names, str) and names != "all-linear":
            try:
                re.compile(names)
            except re.error as err:
                raise ConfigError(f"{folder}: {key} {names!r} is not a regex ({err})") from err


def _peft_adapts(config: dict[str, Any], module: LoraModule) -> bool:
    """Whether PEFT applies ``module``'s pair under ``config``, by PEFT's rule (``check_target_module_exists``): not
    matched by ``exclude_modules``; ``target_modules`` a regex over the whole path (``layers_to_transform`` is then
    not read), a list holding the path itself (nor then), or a list naming a module at a dot boundary, ``all-linear``
    or none (every module), each then in ``layers_to_transform`` when it names any layer."""
    if _matches(config.get("exclude_modules"), module.path, False):
        return False
    targets = config.get("target_modules")
    if isinstance(targets, str) and targets != "all-linear":
        return re.fullmatch(targets, module.path) is not None
    if isinstance(targets, list) and module.path in targets:
        return True
    if not _matches(targets, module.path, True):
        return False
    layers = config.get("layers_to_transform")
    if layers is None or layers == []:
        return True
    return module.layer in ([layers] if is_int(layers) else list(layers))


def _matches(names: Any, path: str, when_absent: bool) -> bool:
    """PEFT's module matching: a list of names at a dot boundary, a regex over the whole path, ``all-linear``."""
    if names is None:
        return when_absent
    if names == "all-linear":
        return True
    if isinstance(names, str):
        return re.fullmatch(names, path) is not None
    return any(path == name or path.endswith(f".{name}") for name in names)


def check_adapter_fits(adapter: LoraAdapter, shapes: dict[str, tuple[int, ...]], num_layers: int) -> None:
    """Raise ConfigError unless every LoRA pair matches the base weight it adapts (same base model)."""
    for (layer, module), lora in adapter.modules.items():
        target = shapes.get(f"{lora.path}.weight")
        if layer >= num_layers or target is None:
            raise ConfigError(
                f"adapter {adapter.folder} adapts {lora.path}, which the base (with {num_layers} layers) does not "
                "have: was the adapter trained on another base model?"
            )
        out_features, in_features = target
        if lora.a.shape[1] != in_features or lora.b.shape[0] != out_features:
            raise ConfigError(
                f"adapter {adapter.folder} does not fit the base: {lora.path} is {out_features}x{in_features} but "
                f"its LoRA is {lora.b.shape[0]}x{lora.rank} @ {lora.rank}x{lora.a.shape[1]}: was it trained on "
                "another base model?"
            )


def sub_adapter_config(adapter: LoraAdapter, ranks: dict[tuple[int, str], int]) -> dict[str, Any]:
    """adapter_config.json for the sliced adapter: explicit target list, ranks and alphas per module.

    ``ranks`` maps (layer, module) to the kept rank (> 0); other modules are dropped.
    """
    config = copy.deepcopy(adapter.config)
    targets = {adapter.modules[key].path: (rank, adapter.modules[key].scaling) for key, rank in ranks.items()}
    top = max(rank for rank, _ in targets.values())
    top_scaling = next(scale for rank, scale in targets.values() if rank == top)
    config.update(
        base_model_name_or_path=None,  # the pruned base is the folder above; PEFT gets it from the caller
        target_modules=sorted(targets),
        exclude_modules=None,
        layers_to_transform=None,
        layers_pattern=None,
        use_rslora=False,  # scaling is carried by alpha_pattern: alpha_r / r == alpha / r_max for every r
        r=top,
        lora_alpha=top_scaling * top,
        rank_pattern={path: rank for path, (rank, _) in sorted(targets.items())},
        alpha_pattern={path: scale * rank for path, (rank, scale) in sorted(targets.items())},
        inference_mode=True,
    )
    return config

"""Latency lookup tables: measured seconds per layer option, the DP's third cost (``--cost latency``).

``nsc-prune profile`` (``nsc_prune.hf.latency.transformers_backend``) measures, on the machine and backend a user deploys on, how long
each option of each layer takes (``prefill``: a forward of ``batch x prefill_tokens`` tokens; ``decode``: one greedy
step at batch 1 after ``decode_context`` tokens) and the parts every plan has (embeddings, final norm, lm_head, the
framework's fixed overhead). A plan's predicted latency is ``fixed + sum of its layers' options``: additive, so the
exact DP solves over it like over parameters. This module reads, checks and writes the table; it imports no torch.

A table is tied to one model and one space: it records the model's layer shapes (a fingerprint) and every layer's
options (``LayerPlan``s; dicts in the file, ``space.options``), and a search with another model or space is refused
(``check_fits``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsc_prune._io import publish_text, read_json_object, to_json
from nsc_prune._validation import must_be
from nsc_prune.choices import DEVICES, LATENCY_BACKENDS, PHASES, PROFILE_DTYPES
from nsc_prune.core.front import LayerCosts, SearchSpace, option_plans
from nsc_prune.core.layer_plan import LayerPlan
from nsc_prune.core.spec import layer_dims
from nsc_prune.errors import ConfigError, InvalidInputError

SCHEMA_VERSION = 1
MICROSECONDS = 1e6  # the DP's integer latency unit


def usable_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The CPUs this process may run on: its affinity where the OS tells it (else every CPU), at most what a
    container's CPU quota allows (``cgroup``: cgroup v2 ``cpu.max``, or v1 ``cpu/cpu.cfs_quota_us``)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = _cpu_quota(cgroup)
    return min(cpus, quota) if quota is not None else cpus


def _cpu_quota(cgroup: Path) -> int | None:
    """The CPUs a cgroup's quota allows, rounded up, or None (no quota, or no cgroup to read)."""
    for quota_file, period_file in (("cpu.max", None), ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us")):
        try:
            fields = (cgroup / quota_file).read_text().split()
            quota, period = fields[0], fields[1] if period_file is None else (cgroup / period_file).read_text().strip()
            if quota != "max" and int(quota) > 0:
                return max(1, math.ceil(int(quota) / int(period)))
        except (OSError, ValueError, IndexError, ZeroDivisionError):
            continue
        return None  # the file says there is no quota
    return None


@dataclass(frozen=True)
class ProfileSettings:
    """How ``nsc_prune.hf.latency.profile.profile_latency`` times each option (docs/speed.md)."""

    device: str = "cpu"  # cpu or cuda: the machine the plan will be deployed on
    backend: str = "transformers"  # or llama.cpp (cpu, batch 1)
    dtype: str | None = None  # default float32 on cpu, bfloat16 on cuda; llama.cpp: float16 (a f16 GGUF)
    batch: int = 1  # prefill batch
    prefill_tokens: int = 512
    decode_context: int = 128  # tokens in the KV cache before the timed decode steps
    decode_tokens: int = 32  # timed greedy steps per run
    repeats: int = 10  # rounds: the options are timed in turn, the fastest run of each is kept
    stack: int = 8  # identical layers per timed model
    threads: int | None = None  # CPU threads while timing; None: the backend's (torch: all cores; llama.cpp: half)
    seed: int = 0

    def __post_init__(self) -> None:
        for name, choices in (("device", DEVICES), ("backend", LATENCY_BACKENDS)):
            if getattr(self, name) not in choices:
                raise ConfigError(must_be(f"--{name}", f"one of {choices}", getattr(self, name)))
        if self.dtype is not None and self.dtype not in PROFILE_DTYPES:
            raise ConfigError(must_be("--dtype", f"one of {PROFILE_DTYPES}", self.dtype))
        for name in ("batch", "prefill_tokens", "decode_context", "decode_tokens", "repeats", "stack"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidInputError(must_be(_flag(name), "a positive integer", value))
        if self.threads is not None and (
            not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 1
        ):
            raise InvalidInputError(must_be("--threads", "a positive integer", self.threads))
        cpus = usable_cpus()
        if self.threads is not None and self.threads > cpus:  # oversubscribed timings mislead; 100000 crashed BLAS
            raise InvalidInputError(must_be("--threads", f"at most the {cpus} CPUs this process may use", self.threads))
        if self.backend == "llama.cpp":
            for name, wanted in (("device", "cpu"), ("batch", 1)):
                if getattr(self, name) != wanted:
                    why = "--backend llama.cpp times on the cpu at batch 1 (its Python binding runs one sequence)"
                    raise ConfigError(
                        must_be(_flag(name), f"{wanted} with --backend llama.cpp", getattr(self, name), why)
                    )
        elif self.dtype == "q8_0":
            raise ConfigError(must_be("--outtype q8_0", "used with --backend llama.cpp", "--backend transformers"))

    @property
    def timed_dtype(self) -> str:
        """The dtype timed: ``dtype``, else float32 on cpu and bfloat16 on cuda (llama.cpp: float16)."""
        if self.dtype:
            return self.dtype
        return "float16" if self.backend == "llama.cpp" else "bfloat16" if self.device == "cuda" else "float32"


def _flag(name: str) -> str:
    """The ``nsc-prune profile`` flag of a ``ProfileSettings`` field (``batch`` is ``--batch-size``)."""
    return "--batch-size" if name == "batch" else f"--{name.replace('_', '-')}"


def model_fingerprint(config: Mapping[str, Any], *, with_init: bool = False) -> str:
    """sha256 (16 hex digits) of what a model's speed depends on: type, vocabulary, every layer's shapes.

    Not the init std a config states (the preset of SmolLM2 and its prepared folder differ in it, and a table of one
    was refused for the other); its field keeps the default in the hashed text, so a table of a model at the default
    keeps the fingerprint it had. ``with_init``: the fingerprint of tables written before, which held it."""
    layers = layer_dims(config)
    if not with_init:
        layers = [dataclasses.replace(dims, initializer_range=DEFAULT_INIT_RANGE) for dims in layers]
    shapes = {
        "model_type": config.get("model_type"),
        "vocab_size": config.get("vocab_size"),
        "tie_word_embeddings": config.get("tie_word_embeddings"),
        "layers": [repr(dims) for dims in layers],
    }
    return hashlib.sha256(json.dumps(shapes, sort_keys=True).encode()).hexdigest()[:16]


DEFAULT_INIT_RANGE = 0.02


def space_options(space: SearchSpace) -> list[list[LayerPlan]]:
    """Every layer's options: what a table must cover, in the space's order."""
    return option_plans(space, "the space for a latency table")


def describe_backend(backend: Mapping[str, Any]) -> str:
    """A table's ``backend`` record in words (``transformers on cpu, float32``); a hand-made table may lack it."""
    if not backend:
        return "backend not recorded"
    return f"{backend.get('name', 'unnamed backend')} on {backend.get('device', '?')}, {backend.get('dtype', '?')}"


@dataclass(frozen=True)
class LatencyTable:
    """Measured seconds per phase: ``fixed[phase]`` for what every plan has, ``layers[l][j][phase]`` per option."""

    model: Mapping[str, Any]  # name, fingerprint
    space: Mapping[str, Any]  # name, description, options (``space_options``: every layer's LayerPlans)
    fixed: Mapping[str, float]
    layers: tuple[tuple[Mapping[str, float], ...], ...]
    backend: Mapping[str, Any] = field(default_factory=dict)  # name, device, dtype, versions
    settings: Mapping[str, Any] = field(default_factory=dict)  # batch, tokens, repeats, ...
    machine: Mapping[str, Any] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def costs(self, phase: str) -> LayerCosts:
        """The DP's integer costs (microseconds) of ``phase``."""
        if phase not in PHASES:
            raise ConfigError(must_be("latency phase", f"one of {PHASES}", phase))

        def us(seconds: float) -> int:
            return round(seconds * MICROSECONDS)

        layers = tuple(tuple(us(option[phase]) for option in options) for options in self.layers)
        costs = LayerCosts(fixed=us(self.fixed[phase]), layers=layers)
        if costs.fixed + sum(row[0] for row in layers) < 1:
            raise InvalidInputError(
                must_be(f"the latency table's full model ({phase})", "at least 1 us", "0 us", "Nothing to budget")
            )
        return costs

    def full_us(self, phase: str) -> int:
        """The full model's predicted ``phase`` latency in the search's whole microseconds (``costs``: each option
        rounded, as the search sums them): every layer's first option (the space lists widest first)."""
        costs = self.costs(phase)
        return costs.fixed + sum(row[0] for row in costs.layers)

    def fastest_seconds(self, phase: str) -> float:
        """The fastest plan's predicted ``phase`` latency (every layer at its cheapest option)."""
        return self.fixed[phase] + sum(min(option[phase] for option in row) for row in self.layers)

    def describe(self) -> str:
        """``transformers on cpu, float32`` and the like, for messages."""
        return describe_backend(self.backend)

    def check_fits(self, space: SearchSpace, config: Mapping[str, Any], where: str) -> None:
        """Refuse (one line) a table measured for another model or another space."""
        fingerprint = model_fingerprint(config)
        if self.model.get("fingerprint") not in (fingerprint, model_fingerprint(config, with_init=True)):
            raise ConfigError(
                f"latency table {where} was profiled for model {self.model.get('name')!r} (layer shapes "
                f"{self.model.get('fingerprint')}), not this one ({fingerprint}); run nsc-prune profile for this model"
            )
        if [list(options) for options in self.space.get("options", [])] != space_options(space):
            if self.space.get("description") == space.description:  # "space 'x' (FFN ...), not 'x' (FFN ...)"
                raise ConfigError(
                    f"latency table {where}'s option list differs from space {space.name!r} ({space.description}) "
                    "though it names the same space: it was edited; run nsc-prune profile again"
                )
            raise ConfigError(
                f"latency table {where} was profiled for space {self.space.get('name')!r} "
                f"({self.space.get('description')}), not {space.name!r} ({space.description}); "
                "run nsc-prune profile with the same --space and --set"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "model": dict(self.model),
            "space": {**self.space, "options": [[dict(plan) for plan in row] for row in self.space["options"]]},
            "backend": dict(self.backend),
            "settings": dict(self.settings),
            "machine": dict(self.machine),
            "unit": "seconds",
            "fixed": dict(self.fixed),
            "layers": [[dict(option) for option in options] for options in self.layers],
            "provenance": dict(self.provenance),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> LatencyTable:
        """Check and type a loaded table (one line naming what is wrong)."""

        def bad(what: str) -> ConfigError:
            return ConfigError(f"{where} is not an nsc-prune latency table ({what}); re-run nsc-prune profile")

        if "points" in data and "layers" not in data:  # a search's pareto.json, passed where its table belongs
            raise ConfigError(
                f"{where} is a search's Pareto front (pareto.json), not a latency table: pass the table nsc-prune "
                "profile wrote (--out FILE)"
            )
        if data.get("schema_version") != SCHEMA_VERSION:
            raise bad(f"schema_version {data.get('schema_version')!r}, expected {SCHEMA_VERSION}")
        for key in ("model", "space", "fixed", "layers"):
            if key not in data:
                raise bad(f"no {key!r}")
        if data.get("unit") != "seconds":  # every time below is read as seconds
            raise bad(f"unit {data.get('unit')!r}, expected 'seconds'")
        if not isinstance(data["model"], Mapping) or not isinstance(data["space"], Mapping):
            raise bad("'model' and 'space' must be objects")
        for key in ("backend", "settings", "machine", "provenance"):  # read as objects by describe and search
            if not isinstance(data.get(key) or {}, Mapping):
                raise bad(f"{key!r} must be an object")
        seconds = f"non-negative {' and '.join(PHASES)} seconds below {MAX_SECONDS:.0e}"
        if not isinstance(data["fixed"], Mapping) or not all(_seconds(data["fixed"].get(phase)) for phase in PHASES):
            raise bad(f"'fixed' (embeddings, final norm, LM head) needs {seconds}")
        layers, options = data["layers"], data["space"].get("options")
        if not isinstance(layers, list) or not isinstance(options, list) or len(layers) != len(options):
            raise bad("'layers' must list one row per layer of 'space.options'")
        for l, (row, labels) in enumerate(zip(layers, options)):
            if not isinstance(labels, list):
                raise bad(f"layer {l}'s entry of 'space.options' must be a list of its options")
            if not isinstance(row, list) or len(row) != len(labels):
                raise bad(f"layer {l} must time each of its {len(labels)} options")
            if not all(isinstance(label, Mapping) for label in labels):
                raise bad(f"layer {l}: every option in 'space.options' must be an object")
            for timed in row:
                if not isinstance(timed, Mapping) or not all(_seconds(timed.get(phase)) for phase in PHASES):
                    raise bad(f"layer {l}: every entry needs {seconds}")
        plans = [
            [
                LayerPlan.from_dict(label, f"{where}: layer {l} option {j}", f"{where}: options")
                for j, label in enumerate(labels)
            ]
            for l, labels in enumerate(options)
        ]
        return cls(
            model=data["model"],
            space={**data["space"], "options": plans},
            fixed=data["fixed"],
            layers=tuple(tuple(row) for row in layers),
            backend=data.get("backend") or {},
            settings=data.get("settings") or {},
            machine=data.get("machine") or {},
            provenance=data.get("provenance") or {},
        )

    @classmethod
    def read(cls, path: str | os.PathLike) -> LatencyTable:
        path = Path(path)
        if path.exists() and not path.is_file():
            raise ConfigError(f"--latency-table {path} is not a file; name the file nsc-prune profile --out wrote")
        if not path.is_file():
            raise ConfigError(
                f"no latency table at {path}; write one with nsc-prune profile --out {shlex.quote(str(path))}"
            )
        return cls.from_dict(read_json_object(path, unique_keys=True), str(path))

    def write(self, path: str | os.PathLike, overwrite: bool = True, checked: bool = False) -> Path:
        """Write the table atomically as sorted, indented JSON (an existing file only with ``overwrite``;
        ``checked``: as ``publish_text``); returns its path."""
        return publish_text(path, to_json(self.to_dict()), overwrite, checked)


MAX_SECONDS = 1e6  # a layer timed at 11 days: past any measurement; the DP's integer microseconds stay far below 2**62


def _seconds(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < MAX_SECONDS


def predicted_seconds(table: LatencyTable, options: Sequence[int], phase: str) -> float:
    """A plan's predicted ``phase`` latency: the fixed part plus each layer's chosen option."""
    return table.fixed[phase] + sum(table.layers[l][j][phase] for l, j in enumerate(options))

"""The plan document: ``pareto.json`` (schema in docs/search.md), written and read as one typed object.

``ParetoDocument`` is what the search writes and what extraction, training and scripts read: the whole
front (``PlanPoint``s), the selected point, and the model, space, cost, budget, score and provenance
records. ``LayerPlan`` (``nsc_prune.core.layer_plan``, re-exported here) is one layer of a point as extraction
needs it (how much the layer keeps): the type a decoder space's options carry from the search on.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsc_prune._files import PARETO_FILE
from nsc_prune._io import json_number, provenance, publish_text, read_json_object, to_json
from nsc_prune._validation import is_int, is_number, must_be
from nsc_prune._warn import warn
from nsc_prune.choices import COST_KINDS, SCORE_ALIASES
from nsc_prune.core.budget import format_count, full_name
from nsc_prune.core.budget import select as select_budget
from nsc_prune.core.front import ParetoResult, SearchSpace, option_plans
from nsc_prune.core.layer_plan import LayerPlan as LayerPlan  # re-exported: nsc_prune.plan.LayerPlan
from nsc_prune.core.layer_plan import upgrade_layer
from nsc_prune.core.spec import DIMENSION_KEYS, PER_LAYER_FIELDS, DecoderDims, decoder_dims, layer_dims
from nsc_prune.errors import ConfigError, InvalidInputError

SCHEMA_VERSION = 2  # 2: a layer's KV groups are "kv_groups" (schema 1 called them "kv_heads"; still read)
_DOCUMENT_KEYS = ("schema_version", "model", "space", "cost", "budget", "selected", "points", "search_seconds",
                  "provenance", "score")  # fmt: skip
LATENCY_CONVENTION = (
    "predicted latency in microseconds: the profiled fixed part plus each layer's profiled option (nsc-prune profile)"
)
_POINT_KEYS = ("params", "macs", "nsc", "layers")


@dataclass(frozen=True)
class ScoreReading:
    """How a person reads a point's ``nsc`` value (the DP's value, which it maximises) under one ``--score``: the
    key stays ``nsc`` in pareto.json for schema compatibility; plots and summaries show ``sign * nsc`` as ``name``."""

    name: str  # what the value is called in the search's summary and on the plot
    sign: int  # shown value = sign * nsc (measured: nsc is the negated damage, so the DP still maximises)
    goal: str  # what the front does with it: "maximising" or "minimising" the shown value
    unit: str = ""

    @property
    def label(self) -> str:
        """The plot axis' label: the name and its unit."""
        return f"{self.name} ({self.unit})" if self.unit else self.name

    def shown(self, nsc: float) -> float:
        return self.sign * nsc + 0.0  # + 0.0: no damage reads 0, not -0


SCORE_READINGS = {  # keyed by choices.SCORES
    "psi_mp": ScoreReading("NSC", 1, "maximising"),  # psi_MP, the closed form from the config
    "psi_w": ScoreReading("NSC (psi_W)", 1, "maximising"),  # psi_W from the real weights' spectra
    "measured": ScoreReading("predicted damage", -1, "minimising", "nats"),  # sum of measured damage (KL or loss)
}


def score_reading(score: str | None) -> ScoreReading:
    """``SCORE_READINGS[score]`` (None: psi_MP; the 0.1 spellings ``mp``/``svd`` are read as their new names)."""
    return SCORE_READINGS[SCORE_ALIASES.get(score or "psi_mp", score or "psi_mp")]


LATENCY_KEY = "latency_us"  # a point's predicted latency (microseconds), when the search had a latency table


def elastic_layer_plans(space: SearchSpace, flag: str) -> list[list[LayerPlan]]:
    """Per layer of an elastic ``space``, its options' ``LayerPlan``s in table order (what the weights-based
    scores measure). ConfigError naming ``flag`` for a space whose options are not FFN widths, KV groups and
    dropped layers (LoRA ranks, the NAS spaces' network-level choices)."""
    expected = "elastic spaces (ffn-grid, ffn-heads, ffn-heads-depth)"
    if len(space.subspaces) != 1:
        raise ConfigError(f"{flag} supports the {expected}; space {space.name!r} has network-level choices")
    plans = option_plans(space, flag)
    for plan in (plan for row in plans for plan in row):
        if plan.kv_groups is None or plan.lora_rank is not None:
            raise ConfigError(
                f"{flag} supports the {expected}; space {space.name!r} has option {dict(plan)} "
                "(only FFN widths, KV groups and dropped layers can be scored from weights)"
            )
    return plans


@dataclass(frozen=True)
class PlanPoint:
    """One Pareto-optimal plan: its costs, NSC, per-layer choices and network-level choices (NAS spaces).

    ``layers`` are the search's labels (``LayerPlan``s in a decoder space) or, read from a file, the layers as
    written (dicts: a NAS space's are not plans, and a file is rewritten as it was read); ``layer_plans()`` types
    them."""

    params: int
    macs: int
    nsc: float
    layers: tuple[Mapping[str, Any], ...]
    choice: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # e.g. {"d_model": 512, "n_layer": 16}
    latency_us: int | None = None  # predicted latency (microseconds), when the search had a latency table

    def cost(self, kind: str) -> int:
        """The point's cost in ``kind`` (params, macs or latency: microseconds, when the search had a table)."""
        if kind not in COST_KINDS:
            raise InvalidInputError(must_be("cost kind", f"one of {', '.join(COST_KINDS)}", kind))
        if kind == "latency":
            if self.latency_us is None:
                raise ConfigError("this pareto file's points have no predicted latency; search with --cost latency")
            return self.latency_us
        return self.params if kind == "params" else self.macs

    def to_dict(self, layers: bool = True) -> dict[str, Any]:
        """The point as ``pareto.json`` holds it (docs/search.md): its choice keys, costs, NSC and (``layers``) its
        layers."""
        latency = {LATENCY_KEY: self.latency_us} if self.latency_us is not None else {}
        point = {**dict(self.choice), "params": self.params, "macs": self.macs, "nsc": self.nsc, **latency}
        if layers:
            point["layers"] = [
                layer.to_dict() if isinstance(layer, LayerPlan) else dict(layer) for layer in self.layers
            ]
        return point

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> PlanPoint:
        """Read a point written by ``to_dict`` (older layer formats upgraded); ``where`` names it in errors."""
        if not isinstance(data, Mapping) or not set(_POINT_KEYS) <= set(data):
            raise ConfigError(f"{where} needs params, macs, nsc and layers")
        layers = data["layers"]
        if not isinstance(layers, list) or not all(isinstance(layer, Mapping) for layer in layers):
            raise ConfigError(f"{where}: 'layers' must be a list of objects")
        _check_numbers(data["params"], data["macs"], data["nsc"], data.get(LATENCY_KEY), where)
        choice = {key: value for key, value in data.items() if key not in (*_POINT_KEYS, LATENCY_KEY)}
        layers = tuple(upgrade_layer(layer, f"{where}: layer {i}") for i, layer in enumerate(layers))
        return cls(data["params"], data["macs"], data["nsc"], layers, choice, data.get(LATENCY_KEY))

    def layer_plans(self) -> list[LayerPlan]:
        """Per-layer plans (axes nsc-prune cannot extract yet are refused)."""
        return layer_plans(self.layers)


def _check_numbers(params: Any, macs: Any, nsc: Any, latency_us: Any, where: str) -> None:
    """ConfigError naming the first of a point's numbers that is not what pareto.json holds (checked on reading: a
    NaN failed after the whole extraction)."""
    for key, value in (("params", params), ("macs", macs), (LATENCY_KEY, latency_us)):
        if (value is not None or key != LATENCY_KEY) and not (is_int(value) and value >= 0):
            raise ConfigError(f"{where}: {must_be(repr(key), 'a whole number >= 0', value)}")
    if not (is_number(nsc) and math.isfinite(nsc)):
        raise ConfigError(f"{where}: {must_be(repr('nsc'), 'a finite number', nsc)}")


_LAYERS_MARK = "\x00layers\x00"  # where a point's line takes its layers' JSON (no real key or value holds a NUL)


def _json_line(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, allow_nan=False, separators=(", ", ": "), default=json_number)


def _point_line(point: PlanPoint, layer_lines: dict[Any, str]) -> str:
    """``point``'s line of ``pareto.json``, each distinct layer's JSON made once in ``layer_lines``: a front of
    50k points holds a few dozen distinct layers, and their dicts were most of the writing time (0.75 s of a 70B
    ``ffn-heads`` search)."""
    layers = []
    for layer in point.layers:
        line = layer_lines.get(layer) if isinstance(layer, LayerPlan) else None
        if line is None:
            line = _json_line(layer.to_dict() if isinstance(layer, LayerPlan) else dict(layer))
            if isinstance(layer, LayerPlan):
                layer_lines[layer] = line
        layers.append(line)
    line = _json_line({**point.to_dict(layers=False), "layers": _LAYERS_MARK})
    return line.replace(_json_line(_LAYERS_MARK), f"[{', '.join(layers)}]", 1)


@dataclass(frozen=True)
class ParetoDocument:
    """Everything about one search run: the front, the selected point and the records that made it."""

    points: tuple[PlanPoint, ...]
    selected: int | None = None
    model: Mapping[str, Any] | None = None  # name, source, config; None for NAS spaces
    space: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    cost: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # kind, seq_len, convention
    budget: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # requested, resolved, above_full_model
    score: Mapping[str, Any] | None = None
    search_seconds: float | None = None
    provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __repr__(self) -> str:  # the generated one printed every point (31 MB for a 70B front)
        return (
            f"ParetoDocument(model={self.model_name!r}, space={self.space.get('name')!r}, "
            f"cost={self.cost.get('kind')!r}, {len(self.points)} points, selected={self.selected})"
        )

    @classmethod
    def from_result(
        cls,
        result: ParetoResult,
        selected: int,
        model: Mapping[str, Any] | None,
        budget: Mapping[str, Any],
        score: Mapping[str, Any] | None = None,
        cost: Mapping[str, Any] | None = None,
    ) -> ParetoDocument:
        """The document of one search: ``result`` with the ``selected`` index, model and budget records; ``cost``
        adds to the cost record (the latency table a latency search used)."""
        space = result.space
        convention = {"params": space.params_convention, "latency": LATENCY_CONVENTION}.get(
            result.cost, space.macs_convention
        )
        return cls(
            points=tuple(
                PlanPoint(p.params, p.macs, p.nsc, tuple(p.layers), dict(p.choice), p.latency_us) for p in result.points
            ),
            selected=selected,
            model=_owned(model) if model else None,
            space={
                "name": space.name,
                "description": space.description,
                "size": str(space.size),
                **dict(space.settings),
            },
            cost={"kind": result.cost, "seq_len": result.seq_len, "convention": convention, **_owned(cost or {})},
            budget=_owned(budget),
            score=_owned(score) if score is not None else None,
            search_seconds=round(result.seconds, 6),
            provenance=provenance(**_input_hashes(model)),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "the pareto file") -> ParetoDocument:
        """Check and type a loaded ``pareto.json``."""
        if not isinstance(data, Mapping) or not isinstance(data.get("points"), list) or not data["points"]:
            raise ConfigError(f"{where} is not a pareto.json: it needs a non-empty 'points' list")
        version = data.get("schema_version", SCHEMA_VERSION)
        if not (is_int(version) and 1 <= version <= SCHEMA_VERSION):
            raise ConfigError(
                f"{where}: schema_version {version!r} is not one this nsc-prune reads (1 to {SCHEMA_VERSION}); a newer "
                "nsc-prune wrote it, or it is not a pareto.json"
            )
        selected, last = data.get("selected"), len(data["points"]) - 1
        if selected is not None and not (is_int(selected) and 0 <= selected <= last):
            raise ConfigError(f"{where}: {must_be(repr('selected'), f'a point index (0 to {last}) or null', selected)}")
        unknown = sorted(set(data) - set(_DOCUMENT_KEYS))
        if unknown:  # the written document would lose them
            warn(f"{where}: ignoring unknown keys {unknown} (written by a newer nsc-prune?)")
        for key in ("model", "space", "cost", "budget", "score", "provenance"):
            if data.get(key) is not None and not isinstance(data[key], Mapping):
                raise ConfigError(f"{where}: {must_be(repr(key), 'an object or null', data[key])}")
        model = data.get("model") or {}
        if model.get("config") is not None and not isinstance(model["config"], Mapping):
            raise ConfigError(f"{where}: {must_be(repr('model.config'), 'an object', model['config'])}")
        if model.get("name") is not None and not isinstance(model["name"], str):
            raise ConfigError(f"{where}: {must_be(repr('model.name'), 'a string', model['name'])}")
        seconds = data.get("search_seconds")
        if seconds is not None and not (is_number(seconds) and 0 <= seconds < math.inf):
            raise ConfigError(f"{where}: {must_be(repr('search_seconds'), 'a number >= 0 or null', seconds)}")
        kind = _cost_kind(data.get("cost") or {}, where)  # checked on reading: with --point it was never looked at
        points = tuple(PlanPoint.from_dict(p, f"{where}: point {i}") for i, p in enumerate(data["points"]))
        chosen = next((i for i, p in enumerate(points) if p.choice), None)
        if data.get("model") is not None and chosen is not None:  # a decoder's points have no network-level choices
            warn(
                f"{where}: point {chosen} has keys a decoder's point does not have, {sorted(points[chosen].choice)}; "
                "they are kept as written and not read (a typo such as 'latency' for 'latency_us', or a newer "
                "nsc-prune?)",
            )
        _check_costs(points, data.get("cost") or {}, kind, where)
        return cls(
            points=points,
            selected=selected,
            model=_owned(data["model"]) if data.get("model") is not None else None,
            space=_owned(data.get("space") or {}),
            cost=_owned(data.get("cost") or {}),
            budget=_owned(data.get("budget") or {}),
            score=_owned(data["score"]) if data.get("score") is not None else None,
            search_seconds=data.get("search_seconds"),
            provenance=_owned(data.get("provenance") or {}),
            schema_version=SCHEMA_VERSION,  # read in any schema, held (and written again) in the current one
        )

    @classmethod
    def read(cls, path: str | os.PathLike) -> ParetoDocument:
        """Read and check a ``pareto.json`` (a file, or a folder holding one)."""
        path = pareto_path(path)
        if not path.is_file():
            raise ConfigError(f"no Pareto file at {path}; run `nsc-prune --model M --budget B --out DIR` first")
        return cls.from_dict(read_json_object(path, unique_keys=True), str(path))

    def to_dict(self) -> dict[str, Any]:
        """The ``pareto.json`` document (schema in docs/search.md)."""
        return {**self._header(), "points": [p.to_dict() for p in self.points]}

    def _header(self) -> dict[str, Any]:
        """The document but its points."""
        doc = {
            "schema_version": self.schema_version,
            "model": _owned(self.model) if self.model is not None else None,
            "space": _owned(self.space),
            "cost": _owned(self.cost),
            "budget": _owned(self.budget),
            "selected": self.selected,
            "search_seconds": self.search_seconds,
            "provenance": _owned(self.provenance),
        }
        if self.score is not None:
            doc["score"] = _owned(self.score)
        return doc

    def to_json(self) -> str:
        """Sorted, indented JSON with one point per line: readable, and fast for fronts of thousands of
        points (json's C encoder only runs without ``indent``). Each point's dict lives only while its line is
        written: a 70B ``lonas`` front of 58k points held about a GiB of them at once."""
        head = to_json(self._header()).rstrip()
        layer_lines: dict[LayerPlan, str] = {}
        rows = ",\n    ".join(_point_line(p, layer_lines) for p in self.points)
        return f'{head[:-1].rstrip()},\n  "points": [\n    {rows}\n  ]\n}}\n'

    def write(self, out_dir: str | os.PathLike, overwrite: bool = True, checked: bool = False) -> Path:
        """Write ``out_dir/pareto.json`` atomically (an existing one only with ``overwrite``; ``checked``: as
        ``publish_text``); returns its path. A document whose points or costs ``read`` would refuse is not
        written."""
        last = len(self.points) - 1
        if last < 0:
            raise ConfigError("a pareto.json needs at least one point; this document has none")
        if self.selected is not None and not (is_int(self.selected) and 0 <= self.selected <= last):
            raise ConfigError(must_be("'selected'", f"a point index (0 to {last}) or None", self.selected))
        for i, point in enumerate(self.points):
            _check_numbers(point.params, point.macs, point.nsc, point.latency_us, f"point {i}")
        _check_costs(self.points, self.cost, _cost_kind(self.cost, "this document"), "this document")
        return publish_text(Path(out_dir) / PARETO_FILE, self.to_json(), overwrite, checked)

    @property
    def cost_kind(self) -> str:
        """The cost the front was searched under (``params`` for files without one)."""
        return _cost_kind(self.cost, "the pareto file")

    @property
    def model_name(self) -> str | None:
        return (self.model or {}).get("name")

    @property
    def model_config(self) -> dict[str, Any]:
        return dict((self.model or {}).get("config") or {})

    def _check_selected(self) -> None:
        """The search selects a point under its resolved budget: a ``selected`` above it names another plan than
        the search chose (a point removed by hand shifts every later index)."""
        resolved = self.budget.get("resolved")
        cost = self.points[self.selected].cost(self.cost_kind)
        if is_int(resolved) and cost > resolved:
            raise InvalidInputError(
                f"the pareto file's 'selected' point {self.selected} costs {cost:,} {self.cost_kind}, above the budget "
                f"it was selected under ({resolved:,}): the file was edited after the search. Pass --point N or "
                "--budget B"
            )

    def select(self, point: int | None = None, budget: str | int | None = None, allow_above_full: bool = False) -> int:
        """Index of the chosen point: ``point``; else the best point whose cost (of the front's kind) is <= ``budget``
        (read as the search reads it: ``core.budget.select``; a percentage is of the full model, ``cost.full`` or
        else the largest point; above it raises unless ``allow_above_full``); else ``selected``."""
        if point is not None and budget is not None:
            raise InvalidInputError("pass either a point index or a budget, not both")
        count = len(self.points)
        if point is not None:
            if not is_int(point) or not 0 <= point < count:
                raise InvalidInputError(
                    must_be(
                        "point",
                        f"an index in 0..{count - 1} (0-based, as 'selected' in pareto.json)",
                        point,
                        "Points are counted from 0; negative indices are not accepted",
                    )
                )
            return int(point)
        if budget is not None:
            kind = self.cost_kind
            costs = [int(p.cost(kind)) for p in self.points]
            other = int(self.points[-1].macs) if kind == "params" else None
            space = str(self.space.get("name") or "")
            full = self.cost.get("full")  # the full model's cost, when a score cut it from the front
            whole = full_name(self.cost.get("full_is_model") is not False)
            return select_budget(costs, budget, allow_above_full, kind, other, space, full, False, whole)[0]
        if self.selected is not None:
            self._check_selected()
            return self.select(point=self.selected)
        raise InvalidInputError("pass --point N or --budget B: the pareto file has no 'selected' point")


def _owned(record: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``record`` down to its nested values: a document shares no dict with its caller, nor its dicts."""
    return copy.deepcopy(dict(record))


def point_label(index: int, count: int | None = None) -> str:
    """How every output names a Pareto point: 0-based, as ``selected`` in pareto.json and ``--point``."""
    return f"point {index} of 0..{count - 1}" if count else f"point {index} (0-based)"


def _check_costs(points: Sequence[PlanPoint], cost: Mapping[str, Any], kind: str, where: str) -> None:
    """ConfigError unless the points cost more each than the one before in ``kind`` (a budget picks the costliest
    point under it: a cost edited by hand picked another) and ``cost``'s full size and flag are well formed."""
    costs = [p.cost(kind) for p in points]
    falling = next((i for i in range(1, len(costs)) if not costs[i] > costs[i - 1]), None)
    if falling is not None:
        raise ConfigError(
            f"{where}: the points must be sorted by their {kind}, each costing more than the one before (as the "
            f"search writes them); point {falling} costs {costs[falling]:,} after {costs[falling - 1]:,}"
        )
    full = cost.get("full")
    if full is not None and not (is_int(full) and full >= max(int(p.cost(kind)) for p in points)):
        raise ConfigError(f"{where}: {must_be(repr('cost.full'), 'an integer, at least every point', full)}")
    is_model = cost.get("full_is_model")  # absent (or null) before 12-06: the model
    if is_model is not None and not isinstance(is_model, bool):
        raise ConfigError(f"{where}: {must_be(repr('cost.full_is_model'), 'true or false', is_model)}")


def _cost_kind(cost: Any, where: str) -> str:
    """The kind a front's ``cost`` record names (``params`` when it names none); ConfigError for any other."""
    kind = cost.get("kind", "params") if isinstance(cost, Mapping) else cost
    if kind not in COST_KINDS:
        raise ConfigError(f"{where}: {must_be('the cost kind', f'one of {COST_KINDS}', kind, 'Re-run the search')}")
    return kind


def plan_name(model: str, params: int | None = None, index: int | None = None) -> str:
    """How a file name says the plan it holds: ``<model>-<params>-p<point>`` (``SmolLM2-135M-Instruct-108.411M-p12``),
    parts not known left out; characters a file name should not hold become ``-``."""
    parts = [model, format_count(params) if params is not None else None, f"p{index}" if index is not None else None]
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", "-".join(p for p in parts if p)).strip("-.") or "model"


def pareto_path(path: str | os.PathLike) -> Path:
    """``path`` itself, or the ``pareto.json`` inside it when it is a folder."""
    path = Path(path)
    return path / PARETO_FILE if path.is_dir() else path


def as_document(pareto: str | os.PathLike | ParetoDocument | Mapping[str, Any]) -> ParetoDocument:
    """A ``ParetoDocument`` from a path, a loaded dict or a document."""
    if isinstance(pareto, ParetoDocument):
        return pareto
    if isinstance(pareto, Mapping):
        return ParetoDocument.from_dict(pareto)
    return ParetoDocument.read(pareto)


def _input_hashes(model: Mapping[str, Any] | None) -> dict[str, str]:
    """sha256 of the resolved model config (canonical JSON), to tell runs on the same config apart."""
    if not model or "config" not in model:
        return {}
    return {"model_config_sha256": hashlib.sha256(to_json(model["config"]).encode()).hexdigest()}


def select_point(
    pareto: ParetoDocument | Mapping[str, Any],
    point: int | None = None,
    budget: str | int | None = None,
    allow_above_full: bool = False,
) -> int:
    """``ParetoDocument.select`` for a document or a loaded ``pareto.json`` dict."""
    return as_document(pareto).select(point=point, budget=budget, allow_above_full=allow_above_full)


def layer_plans(layers: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> list[LayerPlan]:
    """Per-layer plans from a point's ``layers`` (or from a point dict); unknown keys warn, wrong types fail."""
    if isinstance(layers, Mapping):
        layers = layers.get("layers") or []
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
        raise ConfigError(f"a point's 'layers' must be a list of objects; got {layers!r}")
    plans = [LayerPlan.from_dict(layer, f"plan layer {i}", "the plan's layers") for i, layer in enumerate(layers)]
    if not plans:
        raise ConfigError("the Pareto point has no 'layers' list")
    return plans


# What a plan's widths and costs depend on: a base that differs in any is another model.
SAME_MODEL_KEYS = ("model_type", *DIMENSION_KEYS, "tie_word_embeddings")


def check_same_model(pareto_config: Mapping[str, Any], base_config: Mapping[str, Any]) -> None:
    """Raise ConfigError when pareto.json was computed for another architecture than the base: their sizes as the
    model reads them (a ``head_dim`` left out is the family's default, a null one hidden / heads), layer by layer."""
    try:  # a pruned checkpoint's layers differ only in its per-layer entries
        planned, given = layer_dims(pareto_config), layer_dims(base_config)
    except ConfigError:  # a document of another kind of model: its global keys as written are all there is
        planned, given = (), ()
    read = (decoder_dims(pareto_config), decoder_dims(base_config)) if planned else None
    for key in SAME_MODEL_KEYS:
        if read is not None:
            ours, theirs = (getattr(dims, key) for dims in read)
        elif key in pareto_config and key in base_config:
            ours, theirs = pareto_config[key], base_config[key]
        else:
            continue
        if ours != theirs:
            raise ConfigError(
                f"the plan was made for {key}={ours!r} but the base has {key}={theirs!r}; pass the base the "
                "search was run for"
            )
    for i, (ours, theirs) in enumerate(zip(planned, given)):
        if [getattr(ours, key) for key in PER_LAYER_FIELDS] != [getattr(theirs, key) for key in PER_LAYER_FIELDS]:
            raise ConfigError(
                f"the plan was made for a model whose layer {i} has {_layer_shape(ours)} but the base's has "
                f"{_layer_shape(theirs)}; pass the base the search was run for"
            )


def _layer_shape(dims: DecoderDims) -> str:
    return f"FFN {dims.intermediate_size}, {dims.num_attention_heads} heads, {dims.num_key_value_heads} KV heads"

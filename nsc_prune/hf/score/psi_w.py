"""psi_W back-end (paper appendix G.2): layer values from the singular spectra of the actual
truncated weights instead of the closed form, and its consistency report against psi_MP.

``psi(W[:k]) = ln det(I + W[:k] W[:k]^T)`` is the log of a leading principal minor of
``I + W W^T``, so one Cholesky factorisation gives psi for *every* prefix width at once
(``2 * cumsum(log diag L)``) instead of one SVD per width. Weights are read one tensor at a time
from safetensors; results are cached on disk keyed by the tensor's content hash.

Supports the elastic spaces of plain models (per-layer FFN width, KV groups, dropped layers),
keeping the FIRST channels and KV groups as extraction's ``first`` selection does. The weights folder
is checked against the model config (config.json and every projection's shape) before any compute.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nsc_prune import _files
from nsc_prune._io import atomic_write_text, check_cache_path, parse_json
from nsc_prune._validation import must_be
from nsc_prune._warn import warn
from nsc_prune.core.front import ParetoResult, SearchSpace
from nsc_prune.core.spec import layer_dims, refuse_kv_cuts, require_weights_support
from nsc_prune.errors import ConfigError, InvalidInputError, require
from nsc_prune.hf.progress import progress
from nsc_prune.hf.ranks import Ranks
from nsc_prune.hf.weights.base import check_weights_match, weight_part
from nsc_prune.hf.weights.values import all_finite
from nsc_prune.plan import LayerPlan, elastic_layer_plans
from nsc_prune.ranking.metrics import kendall_tau, spearman_rho

CACHE_VERSION = 2  # 2: the key holds the tensor's dtype and shape


def prefix_psi(matrix: Any, axis: int, device: str = "cpu") -> np.ndarray:
    """``psi`` of the first ``k`` rows (``axis=0``) or columns (``axis=1``) of ``matrix`` for
    every ``k = 0..size``, from one Cholesky factorisation of ``I + Gram`` (float64, on ``device``)."""
    torch = require("torch", "hf")
    w = matrix.to(device=device, dtype=torch.float64)
    gram = w @ w.T if axis == 0 else w.T @ w
    gram.diagonal().add_(1.0)
    chol = torch.linalg.cholesky(gram)
    return np.concatenate(([0.0], np.cumsum(2.0 * np.log(chol.diagonal().cpu().numpy()))))


def block_psi(matrix: Any, size: int, axis: int) -> np.ndarray:
    """``psi`` of each consecutive block of ``size`` rows/columns (one per attention head)."""
    from nsc_prune.core.capacity import psi_weights

    blocks = matrix.split(size, dim=axis)
    return np.array([psi_weights(block.double()) for block in blocks])


class _CachedReader:
    """Reads tensors by name and memoises per-tensor results on disk by content hash."""

    def __init__(self, model_dir: Path, cache_dir: Path):
        from nsc_prune.hf.weights.safetensors_io import TensorReader, index_model_dir

        self.tensors = index_model_dir(model_dir)
        self.reader = TensorReader()
        self.cache_dir = cache_dir

    def compute(self, config: Mapping[str, Any], layer: int, module: str, kind: str, fn) -> np.ndarray:
        """``fn`` of ``module``'s weight in ``layer`` (its rows of a fused tensor: ``weight_part``), memoised."""
        torch = require("torch", "hf")
        info, rows = weight_part(self.tensors, config, layer, module)
        tensor = self.reader.read(info)[rows].contiguous()
        digest = hashlib.sha256(hashlib.sha256(f"{info.dtype}{tuple(tensor.shape)}".encode()).digest())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())  # in place: no copy of the tensor's bytes
        path = self.cache_dir / f"{digest.hexdigest()[:32]}-{kind}-v{CACHE_VERSION}.json"
        check_cache_path(path)
        cached = _cached_values(path, _value_count(kind, tuple(tensor.shape))) if path.is_file() else None
        if cached is not None:  # these bytes were checked finite when the entry was computed
            return cached
        if not all_finite(tensor):  # the Cholesky factorisation would fail (or psi be NaN)
            raise ConfigError(f"--weights: tensor {info.name} holds NaN or inf values; psi_W needs finite weights")
        values = fn(tensor)
        atomic_write_text(path, json.dumps(values.tolist()))
        return values


def _value_count(kind: str, shape: tuple[int, ...]) -> int:
    """How many values a ``kind`` of one weight holds: a prefix per row/column count 0..n, or one per head."""
    axis = 0 if kind.endswith("rows") or kind.startswith("rows") else 1
    if kind.startswith("prefix"):
        return shape[axis] + 1
    return -(-shape[axis] // int(kind.removeprefix("rows").removeprefix("cols")))


def _cached_values(path: Path, count: int) -> np.ndarray | None:
    """A cache entry's values; None, with a warning, when it is not ``count`` finite numbers (a truncated or
    edited file is computed again, as a sensitivity table is)."""
    try:
        values = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        problem = " ".join(str(err).split())
    else:
        if isinstance(values, list) and len(values) == count and all(type(v) in (int, float) for v in values):
            array = np.asarray(values, dtype=np.float64)
            if np.isfinite(array).all():
                return array
        problem = f"not a list of {count} finite numbers"
    warn(f"psi_W cache entry {path} is unreadable ({problem}); computing it again")
    return None


def layer_weight_tables(
    model_dir: str | os.PathLike,
    config: Mapping[str, Any],
    cache_dir: str | os.PathLike | None = None,
    device: str = "cpu",
    ranks: Ranks = Ranks(),
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer: ``(attn_psi_by_kv_groups, ffn_psi_by_width)``: psi_W of the first ``c`` KV
    groups (their query heads and o_proj's columns) for c = 0..KV, and of the first ``k`` FFN channels for
    k = 0..intermediate_size. The Cholesky factorisations (the cost) run on ``device``; spectra are
    float64 everywhere, so the values do not depend on it beyond round-off. ``ranks`` (a launcher's processes,
    ``hf.ranks.current_ranks``): each computes every ``ranks.count``-th layer and every rank gets all of them."""
    from nsc_prune.hf.weights.compute import Compute
    from nsc_prune.hf.weights.fingerprint import weights_fingerprint

    Compute(device).check()
    _weights_folder(model_dir)
    dims = layer_dims(config)  # a pruned checkpoint's layers have their own widths and heads
    reader = _CachedReader(Path(model_dir), Path(cache_dir) if cache_dir else _files.cache_dir("psi_w"))
    tables = {}
    try:
        check_weights_match(Path(model_dir), reader.tensors, config)
        ranks.check_same("the weights of --score psi_w", weights_fingerprint(Path(model_dir), reader.tensors))
        for layer in progress(ranks.mine(len(dims)), "psi_W", "layer"):
            hd, group, kv_heads = dims[layer].head_dim, dims[layer].group_size, dims[layer].num_key_value_heads

            def weight(module: str, kind: str, fn, layer: int = layer) -> np.ndarray:
                return reader.compute(config, layer, module, kind, fn)

            q = weight("self_attn.q_proj", f"rows{hd}", lambda t: block_psi(t, hd, 0))
            k = weight("self_attn.k_proj", f"rows{hd}", lambda t: block_psi(t, hd, 0))
            v = weight("self_attn.v_proj", f"rows{hd}", lambda t: block_psi(t, hd, 0))
            o = weight("self_attn.o_proj", "prefix-cols", lambda t: prefix_psi(t, 1, device))  # one matrix
            per_group = q.reshape(kv_heads, group).sum(axis=1) + k + v
            attn = np.concatenate(([0.0], np.cumsum(per_group))) + o[:: group * hd]
            ffn = (
                weight("mlp.gate_proj", "prefix-rows", lambda t: prefix_psi(t, 0, device))
                + weight("mlp.up_proj", "prefix-rows", lambda t: prefix_psi(t, 0, device))
                + weight("mlp.down_proj", "prefix-cols", lambda t: prefix_psi(t, 1, device))
            )
            tables[layer] = (attn, ffn)
    finally:
        reader.reader.close()
    if ranks.count > 1:  # exchanged as JSON lists (float64 round-trips exactly)
        mine = {str(layer): [attn.tolist(), ffn.tolist()] for layer, (attn, ffn) in tables.items()}
        tables = {
            int(layer): tuple(map(np.asarray, pair)) for part in ranks.gather(mine) for layer, pair in part.items()
        }
    return [tables[layer] for layer in range(len(dims))]


def check_psi_w_inputs(
    space: SearchSpace, config: Mapping[str, Any], weights: str | os.PathLike | None = None
) -> list[list[LayerPlan]]:
    """The options of ``space`` psi_W scores, per layer; ConfigError for a family or a space it does not support,
    or for ``weights`` that are not the model of ``config`` (their headers: before any weight is read)."""
    require_weights_support(config, "--score psi_w")
    cuts = elastic_layer_plans(space, "--score psi_w")
    refuse_kv_cuts(config.get("model_type"), cuts, [d.num_key_value_heads for d in layer_dims(config)], "--score psi_w")
    if weights is not None:
        from nsc_prune.hf.weights.base import check_no_kept_adapter
        from nsc_prune.hf.weights.safetensors_io import index_model_dir

        check_no_kept_adapter(_weights_folder(weights), "--weights")
        check_weights_match(_weights_folder(weights), index_model_dir(Path(weights)), config)
    return cuts


def _weights_folder(model_dir: str | os.PathLike) -> Path:
    if not Path(model_dir).is_dir():  # a file or a missing path: said before an OSError names neither
        raise InvalidInputError(must_be("--weights", "a safetensors model folder", str(model_dir)))
    return Path(model_dir)


def weight_values(
    space: SearchSpace,
    model_dir: str | os.PathLike,
    config: Mapping[str, Any],
    cache_dir: str | os.PathLike | None = None,
    device: str = "cpu",
    ranks: Ranks = Ranks(),
) -> list[list[list[float]]]:
    """psi_W values for every option of an elastic ``space``, shaped ``[subspace][layer][option]`` (the
    factorisations on ``device``, the layers shared among ``ranks``)."""
    cuts = check_psi_w_inputs(space, config)
    tables = layer_weight_tables(model_dir, config, cache_dir, device, ranks)
    return [[[float(tables[l][0][cut.kv_groups] + tables[l][1][cut.ffn]) for cut in row] for l, row in enumerate(cuts)]]


def _plan_value(point, values: Sequence[Sequence[float]]) -> float:
    return float(sum(values[l][j] for l, j in enumerate(point.options)))


def _axis_multisets(point) -> dict[str, Counter]:
    """Each axis's values over the layers (FFN widths, KV groups, ranks, kept layers), ignoring their order: what
    the paper's histogram match compares (appendix G.2), by value, since layers' option tables may differ."""
    axes = {axis for layer in point.layers for axis in layer}
    return {axis: Counter(repr(layer.get(axis)) for layer in point.layers) for axis in axes}


def consistency_report(mp: ParetoResult, svd: ParetoResult, values: Sequence[Sequence[float]]) -> dict[str, Any]:
    """psi_MP vs psi_W as in the paper's Table 13, over the psi_MP front's points: Kendall tau and
    Spearman rho between the two scores of the same plans (None where one score is constant over the front:
    weights whose channels psi_W cannot tell apart, or a front of one point), histogram match of the chosen
    layer options at each budget (each axis's multiset), and psi_W-oracle regret of trusting psi_MP."""
    mp_points = mp.points
    w_of_mp = np.array([_plan_value(p, values) for p in mp_points])
    matches, regrets = 0, []
    for point, w_value in zip(mp_points, w_of_mp):
        oracle = svd.points[svd.index_under(mp.cost_of(point))]
        matches += _axis_multisets(point) == _axis_multisets(oracle)
        regrets.append((oracle.nsc - w_value) / oracle.nsc if oracle.nsc else 0.0)
    mp_values, ranked = [p.nsc for p in mp_points], len(mp_points) > 1  # one point ranks nothing
    return {
        "points": len(mp_points),
        "kendall_tau": kendall_tau(mp_values, w_of_mp) if ranked else None,
        "spearman_rho": spearman_rho(mp_values, w_of_mp) if ranked else None,
        "histogram_match": matches / len(mp_points),
        "regret_mean": float(np.mean(regrets)),
        "regret_max": float(np.max(regrets)),
    }

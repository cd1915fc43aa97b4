"""Reconstruction: after a layer loses input channels, refit the matrix that reads them so the layer's output
changes least on calibration text (``extract --reconstruct``).

Cutting FFN channels removes columns of ``down_proj``; cutting KV groups removes columns of ``o_proj`` (their
query heads' outputs). For such a matrix ``W`` (out x n) with kept input columns ``K`` and cut ones ``P``, and
``G = sum_t x_t x_t^T`` the Gram matrix of its inputs over the calibration tokens, extraction writes

    W_K' = W_K + W_P B,   B = G_PK (G_KK + lambda I)^-1,   lambda = ridge * mean(diag(G_KK))

instead of the plain cut ``W_K``: each cut channel is replaced by its ridge regression on the kept ones, so
``W_K' x_K`` is the least-squares fit of ``W x`` (exactly so at ridge 0). The same layer-wise least-squares idea as
FLAP's bias compensation and the OBS-style updates of ZipLM and SlimGPT, in its closed form for whole columns.

Layers are refit in order, each on the hidden states the already-refit layers before it produce (the stream a
pruned model sees; within a layer that cuts both, ``down_proj``'s Gram matrix is gathered in the same pass as
``o_proj``'s, so its inputs follow the layer's uncut attention: an approximation there), streamed one decoder
layer at a time like ``activation`` selection: memory is one float32 layer, the calibration tokens' hidden
states, and one float64 Gram matrix per cut matrix (n x n: 1536^2 x 8 bytes for SmolLM2's FFN, 11008^2 x 8 = 0.97
GB for LLaMA-7B's); the refit blocks are kept in float32 until written.
A dropped layer is left out of the stream (the identity on the residual), as the pruned model leaves it out.

The ridge is relative, so it does not depend on the number of tokens; it trades fitting the calibration
text against staying near the plain cut on text of other domains (docs/extract.md, "Reconstruction").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nsc_prune._validation import is_number
from nsc_prune.errors import ConfigError, InvalidInputError, require
from nsc_prune.hf.cut.keep import Index, LayerIndex
from nsc_prune.hf.weights.compute import Compute
from nsc_prune.hf.weights.values import all_finite

DEFAULT_RIDGE = 1.0
"""Measured on SmolLM2-135M (docs/extract.md): at 1.0 the refit beats the plain cut on all three held-out domains
with 4,096 and with 32,768 calibration tokens; smaller ridges fit the calibration domain better and prose worse."""

MAX_RIDGE = 1e12  # the refit is then the plain cut to about 1e-12
MODULES = ("mlp.down_proj", "self_attn.o_proj")  # the matrices whose input columns a cut removes


@dataclass(frozen=True)
class ReconstructConfig:
    """``ridge``: lambda relative to the mean diagonal of the kept channels' Gram matrix (>= 0)."""

    ridge: float = DEFAULT_RIDGE

    def __post_init__(self) -> None:
        if not is_number(self.ridge) or not 0 <= self.ridge <= MAX_RIDGE:
            larger = is_number(self.ridge) and MAX_RIDGE < self.ridge < math.inf
            fix = "A larger ridge moves the refit toward the plain cut by about 1/ridge (1e308 overflowed)"
            shown = f"{self.ridge:g}" if is_number(self.ridge) else repr(self.ridge)
            raise InvalidInputError(
                f"--reconstruct-ridge must be a number in [0, {MAX_RIDGE:g}]; got {shown}"
                + (f". {fix}" if larger else "")
            )


def check_reconstruct(reconstruct: ReconstructConfig | None, selection: str | None, adapter: Any) -> None:
    """ConfigError unless reconstruction has a calibration text (``selection`` the method, None when not chosen
    yet) and no adapter to merge over the refit weights."""
    if reconstruct is None:
        return
    if adapter is not None:
        raise ConfigError(
            "--reconstruct refits the base's weights, which a LoRA adapter's update was not trained for; drop "
            "--adapter, or drop --reconstruct (a super-adapter is its own recovery)"
        )
    if selection is None:
        raise ConfigError("--reconstruct fits the cut weights on calibration text: pass --calib FILE")
    if selection != "activation":  # --calib given or not: the calibration text goes with activation selection
        raise ConfigError(
            "--reconstruct fits the cut weights on the calibration text of activation selection: pass --calib FILE "
            f"with --selection activation (what --calib selects by default), not --selection {selection}"
        )


def cut_columns(module: str, index: LayerIndex) -> list[int] | None:
    """The input columns of ``module`` (one of ``MODULES``) a kept layer keeps; None when it keeps them all."""
    kept: Index = index.ffn if module == "mlp.down_proj" else index.q
    if kept is None:
        return None
    return list(range(kept)) if isinstance(kept, int) else list(kept)


def refit(weight: Any, gram: Any, kept: list[int], ridge: float) -> Any:
    """``W_K + W_P G_PK (G_KK + lambda I)^-1`` (module docstring) in float64: ``weight`` (out x n), ``gram`` (n x n),
    ``kept`` the kept columns in the order they are written. Returns an out x len(kept) float64 tensor."""
    torch = require("torch", "hf")
    weight, gram = weight.double(), gram.double()
    keep = torch.tensor(kept, dtype=torch.long)
    cut = torch.ones(gram.shape[0], dtype=torch.bool)
    cut[keep] = False
    if not cut.any():
        return weight[:, keep]
    rows = keep[:, None]  # each block gathered straight from the Gram, the largest matrix here, and damped in place
    g_kk, g_kp = gram[rows, keep], gram[rows, cut.nonzero().squeeze(1)]
    damping = ridge * g_kk.diagonal().mean()
    if ridge > 0 and damping != 0:  # NaN (an overflowed Gram) too: the refit is then refused as not finite
        g_kk.diagonal().add_(damping)
        coefficients = torch.linalg.solve(g_kk, g_kp)  # (K, P)
    else:  # the least-squares fit itself; pinv also where no kept channel ever fires (G_KK zero: damping is too)
        coefficients = torch.linalg.pinv(g_kk, hermitian=True) @ g_kp
    del g_kk, g_kp
    refit = weight[:, keep] + weight[:, cut] @ coefficients.T
    if not all_finite(refit):  # never write NaN weights (the calibration's Gram overflowed)
        raise InvalidInputError(
            "the reconstruction refit is not finite; extract without --reconstruct, or with a "
            "smaller --reconstruct-ridge"
        )
    return refit


def _gram_hook(gram: Any) -> Callable[[Any, tuple[Any, ...]], None]:
    def accumulate(module: Any, args: tuple[Any, ...]) -> None:
        x = args[0].detach().flatten(0, -2).double()
        gram.addmm_(x.T, x)

    return accumulate


def reconstructed_blocks(
    indexes: list[LayerIndex | None],
    base: Any,
    input_ids: Any,
    seq_len: int,
    config: ReconstructConfig,
    compute: Compute | None = None,
    bar: str | None = "reconstruction",
) -> dict[tuple[int, str], Any]:
    """The refit kept block (float32, on the CPU) of every matrix of ``MODULES`` whose input columns ``indexes``
    cut, by (base layer, module), over the calibration tokens ``input_ids`` (1-D) in chunks of ``seq_len``."""
    torch = require("torch", "hf")
    from nsc_prune.hf.cut.selection import run_hooked
    from nsc_prune.hf.weights.streaming import stream_layers

    blocks: dict[tuple[int, str], Any] = {}

    def visit(i: int, layer: Any, inputs: list[Any], run: Callable[[Any], Any]) -> list[Any]:
        index = indexes[i]
        if index is None:  # a dropped layer: the pruned model's next layer sees this one's input
            return inputs
        cuts = {m: cols for m in MODULES if (cols := cut_columns(m, index)) is not None}
        if not cuts:
            return [run(h) for h in inputs]
        linears = {m: layer.get_submodule(m) for m in cuts}
        grams = {
            m: torch.zeros(lin.in_features, lin.in_features, dtype=torch.float64, device=lin.weight.device)
            for m, lin in linears.items()
        }
        run_hooked([linears[m].register_forward_pre_hook(_gram_hook(grams[m])) for m in cuts], run, inputs)
        with torch.no_grad():
            for module, kept in cuts.items():
                weight = linears[module].weight
                block = refit(weight, grams[module], kept, config.ridge)
                blocks[(i, module)] = block.float().cpu()
                weight.zero_()  # the pruned layer, for the stream the next layers see
                weight[:, kept] = block.to(weight.dtype)
        return [run(h) for h in inputs]

    stream_layers(base, input_ids, seq_len, visit, bar=bar, compute=compute)
    return blocks

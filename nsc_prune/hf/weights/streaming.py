"""A base model run one decoder layer at a time (calibration and sensitivity), so that a 7B base needs one
layer's weights plus the hidden states of the calibration tokens, never the whole model.

Everything runs on ``Compute.device`` in ``Compute.dtype`` (default: float32 on the CPU).
``StreamedDecoder`` builds the model on the meta device (no weights) with every decoder layer replaced by a
pass-through; ``layer(i)`` gives layer ``i`` its weights (read one tensor at a time from safetensors),
puts it back in place so that the model's own forward runs it with its causal mask and rotary embedding, and
empties it again on exit. ``stream_layers`` is the forward walk over every layer that calibration uses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from nsc_prune.errors import ConfigError, InvalidInputError, require
from nsc_prune.hf.progress import progress
from nsc_prune.hf.weights.compute import Compute

if TYPE_CHECKING:
    from nsc_prune.hf.weights.base import BaseModel

torch = require("torch", "hf")


def _materialize(module: Any, prefix: str, base: BaseModel, reader: Any, device: str) -> None:
    """Give a module built on the meta device (in its compute dtype) real weights on ``device``, read one tensor at
    a time."""
    module.to_empty(device=device)
    for name, param in module.named_parameters():
        info = base.tensors.get(prefix + name)
        if info is None:
            raise InvalidInputError(f"base {base.folder} has no tensor {prefix + name}; the checkpoint is incomplete")
        if tuple(info.shape) != tuple(param.shape):
            raise ConfigError(
                f"base tensor {prefix + name} is {list(info.shape)}, config.json implies {list(param.shape)}"
            )
        param.data.copy_(reader.read(info))  # cast to the module's dtype, moved to its device


def return_freed_memory() -> None:
    """Ask glibc to give freed heap memory back to the OS. Between layers the freed weights and read
    buffers otherwise stay in RSS (fragmented heap under malloc's dynamic mmap threshold): measured +30 MiB
    per layer on the bench_extract.py base. A no-op where there is no glibc."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)  # the process's own symbols: glibc's malloc_trim on Linux
    except (OSError, AttributeError, TypeError):
        pass


class _PassThrough(torch.nn.Module):
    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


class StreamedDecoder:
    """The base's decoder with at most one layer holding weights at a time (module docstring). Close it after
    use (it holds open safetensors files), or use it as a context manager."""

    def __init__(self, base: BaseModel, compute: Compute | None = None):
        from nsc_prune.hf.weights.loading import load_pruned
        from nsc_prune.hf.weights.safetensors_io import TensorReader

        self.base = base
        self.compute = compute or Compute()
        self.compute.check()
        model = load_pruned(base.folder, dtype=self.compute.dtype, device_map="meta", adapter=False)  # no weights read
        self.inner = model.model
        self.layers = list(self.inner.layers)
        rotary = type(self.inner.rotary_emb)(config=self.inner.config)  # the meta copy has no inv_freq
        self.inner.rotary_emb = rotary.to(self.compute.device)
        # Granite scales the embeddings inside the model's forward, which ``run`` calls once per layer: scale them
        # once in ``embed`` instead (1.0 for the families without the multiplier).
        self.embedding_multiplier = float(getattr(self.inner, "embedding_multiplier", 1.0))
        if hasattr(self.inner, "embedding_multiplier"):
            self.inner.embedding_multiplier = 1.0
        # Gemma 2/3 scale inside their embedding module (sqrt(hidden), rounded to the weights' dtype), which
        # ``embed`` bypasses: ``embed`` applies it as they do.
        self.embed_scale = getattr(self.inner.embed_tokens, "scalar_embed_scale", None)
        self.logits_scaling = float(getattr(model.config, "logits_scaling", None) or 1.0)  # Granite: logits / this
        self.logit_softcap = getattr(model.config, "final_logit_softcapping", None)  # Gemma 2: c tanh(logits / c)
        self.final_norm = self.inner.norm
        self.inner.norm = torch.nn.Identity()
        self.inner.layers = torch.nn.ModuleList(_PassThrough() for _ in self.layers)
        self.reader = TensorReader()

    def __enter__(self) -> StreamedDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.reader.close()

    def embed(self, input_ids: Any, seq_len: int, chunks: list[int] | None = None) -> list[Any]:
        """The embeddings of ``input_ids`` (1-D) in chunks of ``seq_len`` tokens, ``[1, tokens, hidden]``, on the
        compute device in its dtype; only the chunks numbered ``chunks`` when given (a rank's share)."""
        embed = self.reader.read(self.base.tensors["model.embed_tokens.weight"])
        device, dtype = self.compute.device, self.compute.torch_dtype
        starts = range(0, len(input_ids), seq_len) if chunks is None else [n * seq_len for n in chunks]
        scale = self.embedding_multiplier
        if self.embed_scale is not None:
            scale = torch.tensor(self.embed_scale, dtype=dtype, device=device)
        hidden = [embed[input_ids[s : s + seq_len]].to(device=device, dtype=dtype)[None] * scale for s in starts]
        del embed
        return_freed_memory()
        return hidden

    def run(self, hidden: Any) -> Any:
        """One chunk through the layer currently in place (``layer``) alone."""
        return self.inner(inputs_embeds=hidden, use_cache=False).last_hidden_state

    @contextlib.contextmanager
    def layer(self, i: int) -> Iterator[Any]:
        """Decoder layer ``i`` with its weights, in place in the model (``run`` runs it); emptied on exit."""
        layer = self.layers[i]
        _materialize(layer, f"model.layers.{i}.", self.base, self.reader, self.compute.device)
        self.inner.layers[i] = layer
        try:
            yield layer
        finally:
            self.inner.layers[i] = _PassThrough()
            layer.to_empty(device="meta")  # frees the layer's weights
            return_freed_memory()

    def head(self) -> tuple[Any, Any]:
        """The final norm and the LM head matrix (the embedding when tied; divided by Granite's ``logits_scaling``, as
        its forward divides the logits), on the compute device in its dtype."""
        _materialize(self.final_norm, "model.norm.", self.base, self.reader, self.compute.device)
        tensors = self.base.tensors
        info = tensors.get("lm_head.weight") or tensors["model.embed_tokens.weight"]
        head = self.reader.read(info).to(device=self.compute.device, dtype=self.compute.torch_dtype)
        return self.final_norm, head / self.logits_scaling if self.logits_scaling != 1.0 else head


def stream_layers(
    base: BaseModel,
    input_ids: Any,
    seq_len: int,
    visit: Callable[[int, Any, list[Any], Callable[[Any], Any]], list[Any]],
    bar: str | None = None,
    compute: Compute | None = None,
) -> None:
    """Run the tokens of ``input_ids`` (1-D, in chunks of ``seq_len``) through ``base`` one decoder layer at a
    time, on ``compute`` (default float32 on the CPU): ``visit(i, layer, inputs, run)`` gets layer ``i`` with its weights, the hidden states
    entering it (one ``[1, tokens, hidden]`` tensor per chunk) and ``run`` (a chunk through that layer alone),
    and returns the hidden states leaving it. Peak memory: one decoder layer, the embedding matrix in its
    stored dtype (only while embedding), the tokens' hidden states and what ``visit`` keeps.
    ``bar``: a progress bar's description (one step per layer; ``hf.progress``), or None for none."""
    with StreamedDecoder(base, compute) as model, torch.no_grad():
        hidden = model.embed(input_ids, seq_len)
        for i in progress(range(len(model.layers)), bar, "layer") if bar else range(len(model.layers)):
            with model.layer(i) as layer:
                hidden = visit(i, layer, hidden, model.run)

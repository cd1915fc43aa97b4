"""Held-out perplexity of a causal LM on token ids: the studies' language-modelling measure (scripts/)."""

from __future__ import annotations

import math
from typing import Any

from nsc_prune._validation import must_be
from nsc_prune.errors import InvalidInputError


def token_losses(model: Any, ids: Any, seq_len: int, bos: int | None = None) -> Any:
    """The next-token cross-entropy (nats, float32) of ``model`` at every token of ``ids`` (1-D token ids) after the
    first, read in windows of ``seq_len`` predicted tokens that overlap by one token (each window's last token is
    the next one's first input, so every token after the first is predicted exactly once). With ``bos`` (a tokenizer
    that starts a text with it: ``bos_token_added``), each window's input is BOS and the ``seq_len - 1`` tokens
    before its last, as a served model reads, and every token is predicted, the first too. No cache."""
    import torch

    if seq_len < 1:
        raise InvalidInputError(must_be("seq_len", "a positive integer", seq_len))
    if len(ids) < 2:
        raise InvalidInputError(must_be("ids", "at least 2 token ids (one to predict)", f"{len(ids)} token ids"))
    losses, weight = [], next(model.parameters(), None)
    device = weight.device if weight is not None else ids.device  # the ids go where the model is
    lead = None if bos is None else torch.tensor([bos], dtype=ids.dtype, device=ids.device)
    with torch.no_grad():
        for start in range(0, len(ids) - (lead is None), seq_len):
            window = (
                ids[start : start + seq_len + 1] if lead is None else torch.cat([lead, ids[start : start + seq_len]])
            )
            window = window[None].to(device)
            logits = model(window[:, :-1], use_cache=False).logits.float()
            losses.append(torch.nn.functional.cross_entropy(logits[0], window[0, 1:], reduction="none"))
    return torch.cat(losses)


def perplexity(model: Any, ids: Any, seq_len: int) -> float:
    """``exp`` of the mean next-token cross-entropy of ``model`` over ``ids`` (``token_losses``)."""
    losses = token_losses(model, ids, seq_len)
    return math.exp(float(losses.double().sum()) / len(losses))

"""Held-out perplexity of a causal LM on token ids: the studies' language-modelling measure (scripts/)."""

from __future__ import annotations

import math
from typing import Any

from nsc_prune._validation import must_be
from nsc_prune.errors import InvalidInputError


def token_losses(model: Any, ids: Any, seq_len: int) -> Any:
    """The next-token cross-entropy (nats, float32) of ``model`` at every token of ``ids`` (1-D token ids) after the
    first, read in windows of ``seq_len`` predicted tokens that overlap by one token (each window's last token is
    the next one's first input, so every token after the first is predicted exactly once). No cache."""
    import torch

    if seq_len < 1:
        raise InvalidInputError(must_be("seq_len", "a positive integer", seq_len))
    if len(ids) < 2:
        raise InvalidInputError(must_be("ids", "at least 2 token ids (one to predict)", f"{len(ids)} token ids"))
    losses, weight = [], next(model.parameters(), None)
    device = weight.device if weight is not None else ids.device  # the ids go where the model is
    with torch.no_grad():
        for start in range(0, len(ids) - 1, seq_len):
            chunk = ids[start : start + seq_len + 1][None].to(device)
            logits = model(chunk[:, :-1], use_cache=False).logits.float()
            losses.append(torch.nn.functional.cross_entropy(logits[0], chunk[0, 1:], reduction="none"))
    return torch.cat(losses)


def perplexity(model: Any, ids: Any, seq_len: int) -> float:
    """``exp`` of the mean next-token cross-entropy of ``model`` over ``ids`` (``token_losses``)."""
    losses = token_losses(model, ids, seq_len)
    return math.exp(float(losses.double().sum()) / len(losses))

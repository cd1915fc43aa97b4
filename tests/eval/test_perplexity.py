"""nsc_prune.eval.perplexity against the next-token NLL computed by hand on a tiny random Llama."""

from __future__ import annotations

import math

import pytest

from nsc_prune.errors import InvalidInputError
from nsc_prune.eval.perplexity import perplexity, token_losses

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture
def model(tiny_llama):
    tiny = tiny_llama(gqa=True, lora=False, layers=2)
    return transformers.AutoModelForCausalLM.from_pretrained(tiny.base, dtype=torch.float32).eval()


def by_hand(model, ids, seq_len: int) -> list[float]:
    """Each token after the first predicted once, from at most ``seq_len`` tokens of windows that start every
    ``seq_len`` tokens: log-softmax and a gather, no cross_entropy."""
    nll = []
    with torch.no_grad():
        for start in range(0, len(ids) - 1, seq_len):
            window = ids[start : start + seq_len + 1]
            logp = torch.log_softmax(model(window[None, :-1]).logits[0].double(), dim=-1)
            nll += (-logp[torch.arange(len(window) - 1), window[1:]]).tolist()
    assert len(nll) == len(ids) - 1
    return nll


@pytest.mark.parametrize(("tokens", "seq_len"), [(41, 8), (40, 8), (9, 8), (2, 8), (30, 64)])
def test_equals_exp_of_the_mean_token_nll(model, tokens, seq_len):
    ids = torch.randint(0, model.config.vocab_size, (tokens,), generator=torch.Generator().manual_seed(1))
    nll = by_hand(model, ids, seq_len)
    assert perplexity(model, ids, seq_len) == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-5)
    assert token_losses(model, ids, seq_len).tolist() == pytest.approx(nll, rel=1e-5)


@pytest.mark.parametrize(("tokens", "seq_len"), [(41, 8), (40, 8), (2, 8), (5, 1)])
def test_with_bos_every_window_starts_with_it_and_every_token_is_predicted(model, tokens, seq_len):
    """A model whose tokenizer starts a text with BOS (LLaMA's, Gemma's) is served windows that start with it."""
    ids = torch.randint(3, model.config.vocab_size, (tokens,), generator=torch.Generator().manual_seed(2))
    nll = []
    with torch.no_grad():
        for start in range(0, tokens, seq_len):
            window = torch.cat([torch.tensor([1]), ids[start : start + seq_len]])
            logp = torch.log_softmax(model(window[None, :-1]).logits[0].double(), dim=-1)
            nll += (-logp[torch.arange(len(window) - 1), window[1:]]).tolist()
    assert token_losses(model, ids, seq_len, bos=1).tolist() == pytest.approx(nll, rel=1e-5) and len(nll) == tokens


def test_a_perfect_predictor_scores_one():
    class Echo(torch.nn.Module):
        """Predicts the next id as the current one plus one, with certainty."""

        def forward(self, ids, use_cache=False):
            logits = torch.full((*ids.shape, 20), -1e4)
            logits.scatter_(-1, (ids + 1)[..., None] % 20, 0.0)
            return transformers.modeling_outputs.CausalLMOutput(logits=logits)

    assert perplexity(Echo(), torch.arange(15), 4) == pytest.approx(1.0)


def test_bad_inputs_are_refused(model):
    with pytest.raises(InvalidInputError, match="seq_len must be a positive integer; got 0"):
        perplexity(model, torch.arange(10), 0)
    with pytest.raises(InvalidInputError, match="ids must be at least 2 token ids"):
        perplexity(model, torch.arange(1), 8)

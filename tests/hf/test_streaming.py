"""A streamed base runs its layers in order, one holding weights at a time, as the whole model does."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nsc_prune.hf.weights import streaming  # noqa: E402
from nsc_prune.hf.weights.base import open_base  # noqa: E402
from nsc_prune.hf.weights.synthetic import llama_config, write_random_base  # noqa: E402


def test_layers_stream_in_order_one_at_a_time_and_match_the_model(tmp_path, monkeypatch):
    config = llama_config(3, 32, 48, 2, 50, dtype="float32")
    write_random_base(tmp_path / "b", config, shard_bytes=1 << 30)
    ids = torch.randint(3, 50, (12,), generator=torch.Generator().manual_seed(0))
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "b", dtype=torch.float32).eval()
    with torch.no_grad():
        expected = model(ids[None, :6], output_hidden_states=True).hidden_states
    decoders = []
    real_layer = streaming.StreamedDecoder.layer
    monkeypatch.setattr(
        streaming.StreamedDecoder, "layer", lambda self, i: decoders.append(self) or real_layer(self, i)
    )
    seen = []

    def visit(i, layer, inputs, run):
        holding = [
            j for j, each in enumerate(decoders[-1].layers) if any(p.device.type != "meta" for p in each.parameters())
        ]
        seen.append((i, holding))
        if i == 0:
            assert torch.allclose(inputs[0], expected[0], atol=1e-6)  # the embeddings of the first chunk
        out = [run(h) for h in inputs]
        if i < 2:  # hidden_states[-1] is after the final norm
            assert torch.allclose(out[0], expected[i + 1], atol=1e-4)
        return out

    streaming.stream_layers(open_base(tmp_path / "b"), ids, 6, visit)
    assert seen == [(0, [0]), (1, [1]), (2, [2])]
    assert not any(p.device.type != "meta" for layer in decoders[-1].layers for p in layer.parameters())

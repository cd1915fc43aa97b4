"""Measured layer sensitivity (``--score measured``): the cut outputs equal the masked block, the measured loss
increases equal the masked model's, a sensitive layer is kept wider, the cached table is reused, bad input."""

from __future__ import annotations

import json
import math
import os
import shutil
import stat

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nsc_prune.cli import main
from nsc_prune.errors import ConfigError, InvalidInputError, UnsupportedArchitectureError
from nsc_prune.hf.cut.keep import LayerOrder
from nsc_prune.hf.score.block_error import cut_outputs
from nsc_prune.hf.score.probes import ProbeConfig, anchor_cuts, measure_errors
from nsc_prune.hf.score.sensitivity import SensitivityConfig
from nsc_prune.hf.weights.base import open_base
from nsc_prune.plan import LayerPlan, elastic_layer_plans
from nsc_prune.spaces.registry import build_space
from tests.conftest import spoil_weight


def _masked(model, layer: int, order: LayerOrder, cut: LayerPlan, group_size: int):
    """A copy of ``model`` whose layer ``layer`` keeps only the first ``cut.ffn`` channels and ``cut.kv_groups``
    groups of ``order`` (zeroed down_proj columns and o_proj columns), or passes its input through when dropped."""
    import copy

    masked = copy.deepcopy(model)
    block = masked.model.layers[layer]
    with torch.no_grad():
        if not cut.keep:
            block.self_attn.o_proj.weight.zero_()
            block.mlp.down_proj.weight.zero_()
            return masked
        block.mlp.down_proj.weight[:, list(order.ffn[cut.ffn :])] = 0.0
        dim = block.self_attn.head_dim
        for g in order.kv_groups[cut.kv_groups :]:
            block.self_attn.o_proj.weight[:, g * group_size * dim : (g + 1) * group_size * dim] = 0.0
    return masked


def _block_io(model, layer: int, ids):
    """(block input, o_proj input, o_proj output, block output) of ``layer`` on one chunk ``ids``."""
    seen = {}
    block = model.model.layers[layer]
    hooks = [
        block.register_forward_pre_hook(
            lambda m, a, k: seen.__setitem__("x", (a[0] if a else k["hidden_states"])[0]), with_kwargs=True
        ),
        block.self_attn.o_proj.register_forward_hook(lambda m, a, o: seen.update(z=a[0][0], attn=o[0])),
        block.register_forward_hook(lambda m, a, o: seen.__setitem__("y", (o[0] if isinstance(o, tuple) else o)[0])),
    ]
    with torch.no_grad():
        model(ids[None], use_cache=False)
    for hook in hooks:
        hook.remove()
    return seen["x"], seen["z"], seen["attn"], seen["y"]


def test_cut_outputs_equal_the_masked_block(tiny_llama):
    """Every cut's output (FFN channels and KV groups in a shuffled order, and dropping) equals the block of a model
    whose removed units are zeroed, run on the same input."""
    tiny = tiny_llama(gqa=True, lora=False)
    model = transformers.LlamaForCausalLM.from_pretrained(tiny.base, dtype=torch.float32).eval()
    order = LayerOrder(tuple(torch.randperm(96, generator=torch.Generator().manual_seed(1)).tolist()), (1, 0))
    cuts = tuple(
        LayerPlan(ffn=f, kv_groups=g, keep=k)
        for f, g, k in ((96, 2, True), (64, 2, True), (96, 1, True), (40, 1, True), (0, 0, False))
    )
    ids = torch.randint(3, 128, (40,), generator=torch.Generator().manual_seed(0))
    x, z, attn, y = _block_io(model, 1, ids)
    with torch.no_grad():
        got = dict(cut_outputs(model.model.layers[1], x, z, attn, order, cuts, group_size=2))
    assert sorted(got) == list(range(len(cuts)))
    for j, cut in enumerate(cuts):
        expected = _block_io(_masked(model, 1, order, cut, 2), 1, ids)[3]
        torch.testing.assert_close(got[j], expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[0], y, rtol=1e-5, atol=1e-5)


def _self_sampled_text(model, tokenizer, sequences: int, length: int = 64, seed: int = 0) -> str:
    """Word-level text (ids ``w3..``) sampled from ``model`` itself, in independent sequences of ``length`` tokens
    (the chunks the table is measured in): the loss increase of a cut on it is then the KL divergence from the
    uncut model in expectation (positive), so even a random tiny model has a meaningful damage."""
    generator = torch.Generator().manual_seed(seed)
    words = [i for i in range(3, 128) if tokenizer(f"w{i}", add_special_tokens=False)["input_ids"] == [i]]
    allowed = torch.zeros(128, dtype=torch.bool)
    allowed[words] = True  # words the tokenizer reads back as one id (it splits some, e.g. w10 -> w1 0)
    ids = []
    with torch.no_grad():
        for _ in range(sequences):
            sequence = [words[int(torch.randint(len(words), (1,), generator=generator))]]
            while len(sequence) < length:
                probs = torch.softmax(model(torch.tensor(sequence)[None], use_cache=False).logits[0, -1].double(), -1)
                probs[~allowed] = 0
                sequence.append(int(torch.multinomial(probs / probs.sum(), 1, generator=generator)))
            ids += sequence
    return " ".join(f"w{i}" for i in ids)


@pytest.fixture
def sensitive_tiny(tiny_llama, tmp_path):
    """A 4-layer tiny model whose layer 2 dominates the residual stream (its FFN output x 6), a peaked LM head,
    and calibration text sampled from the model itself."""
    tiny = tiny_llama(lora=False, layers=4)
    model = transformers.LlamaForCausalLM.from_pretrained(tiny.base, dtype=torch.float32).eval()
    with torch.no_grad():
        model.model.layers[2].mlp.down_proj.weight.mul_(6.0)
        model.lm_head.weight.mul_(5.0)
    model.save_pretrained(tiny.base, max_shard_size="40KB")  # the same shard names as the fixture wrote
    calib = tmp_path / "calib.txt"
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny.base)
    calib.write_text(_self_sampled_text(model, tokenizer, sequences=17))
    return tiny, model, calib


def _probe_setup(tiny, calib):
    """The base, the ffn-heads-depth option grid (step 32, nothing protected), 512 calibration token ids and the
    identity channel orders of the sensitive tiny model."""
    from nsc_prune.hf.cut.selection import calibration_ids

    base = open_base(tiny.base)
    space = build_space("ffn-heads-depth", base.config, ffn_step=32, protect_layers=[])
    ids = calibration_ids(tiny.base, calib.read_text(), 512)
    return base, elastic_layer_plans(space, "test"), ids, [LayerOrder.identity(96, 4)] * 4


def _anchors(row) -> tuple[int, int]:
    """The option indexes of a row whose damage is measured: the narrowest kept option and dropping the layer."""
    narrowest = min((j for j, c in enumerate(row) if c.keep), key=lambda j: (row[j].ffn, -row[j].kv_groups))
    return narrowest, next(j for j, c in enumerate(row) if not c.keep)


def _probe_loss(model, ids, tokens: int = 128) -> float:
    """The whole (not streamed) model's mean next-token loss on the first ``tokens`` of ``ids`` in 64-token chunks."""
    with torch.no_grad():
        chunks = [ids[s : min(s + 64, tokens)] for s in range(0, tokens, 64)]
        nll = [torch.nn.functional.cross_entropy(model(c[None]).logits[0, :-1], c[1:], reduction="sum") for c in chunks]
    return float(sum(nll)) / sum(len(c) - 1 for c in chunks)


def test_measured_loss_increases_equal_the_masked_model(sensitive_tiny):
    """The anchors' damage is the LM loss increase of the masked model on the probe tokens, measured here with the
    whole model (not streamed); the other options follow the block error's shape."""
    tiny, model, calib = sensitive_tiny
    base, cuts, ids, orders = _probe_setup(tiny, calib)
    errors, record = measure_errors(base, ids, 64, cuts, orders, ProbeConfig(128), progress=False)
    assert record["probe_tokens"] == 128
    short = measure_errors(base, ids, 64, cuts, orders, ProbeConfig(100), progress=False)[1]
    assert short["probe_tokens"] == 100 == max(short["probe_tokens_per_layer"])  # said 128: the chunks it ran
    tail = measure_errors(base, ids, 64, cuts, orders, ProbeConfig(65), progress=False)
    assert tail[1]["probe_tokens"] == 64 == max(tail[1]["probe_tokens_per_layer"])  # said 65: a one-token tail
    assert tail[0] == measure_errors(base, ids, 64, cuts, orders, ProbeConfig(64), progress=False)[0]  # predicts none

    clean = _probe_loss(model, ids)
    assert record["probe_clean_loss"] == pytest.approx(clean, rel=1e-5)
    for layer in (1, 2, 3):  # layer 0 is never dropped without protection
        row = cuts[layer]
        narrowest, dropped = _anchors(row)
        for j in (narrowest, dropped):
            expected = max(0.0, _probe_loss(_masked(model, layer, orders[layer], row[j], 1), ids) - clean)
            assert errors[layer][j] == pytest.approx(expected, rel=1e-4, abs=1e-6)
        full = next(j for j, c in enumerate(row) if (c.ffn, c.kv_groups, c.keep) == (96, 4, True))
        assert errors[layer][full] == 0.0
        kept = [errors[layer][j] for j, c in enumerate(row) if c.keep and c.kv_groups == 4]
        assert kept == sorted(kept)  # narrower FFN, more damage (widest first in the table)
    for j in (narrowest, dropped):  # the dominant layer is the most sensitive one
        assert errors[2][j] > max(errors[1][j], errors[3][j])  # layer 3 may clamp at 0: no damage there


def test_a_shortened_probe_equals_the_masked_model_on_its_prefix(sensitive_tiny):
    """With ``probe_depth`` 1 a probe with more than one layer after it runs on a prefix of the probe tokens
    (layer 0: 43 of 128, layer 1: 64); its damage is the masked model's loss increase on those same positions
    (and both targets agree with the uncapped table where the probe is not shortened)."""
    tiny, model, calib = sensitive_tiny
    base, cuts, ids, orders = _probe_setup(tiny, calib)
    errors, record = measure_errors(base, ids, 64, cuts, orders, ProbeConfig(128, depth=1), progress=False)
    full, _ = measure_errors(base, ids, 64, cuts, orders, ProbeConfig(128), progress=False)
    assert record["probe_depth"] == 1 and record["probe_tokens_per_layer"] == [43, 64, 128, 128]

    def increase(m, tokens: int) -> float:
        with torch.no_grad():
            chunks = [ids[s : min(s + 64, tokens)] for s in range(0, tokens, 64)]
            nll = [
                torch.nn.functional.cross_entropy(mm(c[None]).logits[0, :-1], c[1:], reduction="sum")
                for c in chunks for mm in (m, model)
            ]  # fmt: skip
        return float(sum(nll[0::2]) - sum(nll[1::2])) / sum(len(c) - 1 for c in chunks)

    for layer, tokens in ((0, 43), (1, 64)):
        for j in anchor_cuts(tuple(cuts[layer])):
            expected = max(0.0, increase(_masked(model, layer, orders[layer], cuts[layer][j], 1), tokens))
            assert errors[layer][j] == pytest.approx(expected, rel=1e-4, abs=1e-6)
            assert errors[layer][j] != pytest.approx(full[layer][j], rel=1e-3)  # another token set, another value
    assert errors[2:] == full[2:]  # within probe_depth of the head: the whole probe, the same table


@pytest.mark.parametrize("target", ["loss", "kl"])
def test_a_strided_probe_is_the_masked_model_on_every_other_position(sensitive_tiny, target):
    """``probe_stride`` 2: every position is carried through the later layers (the attention needs them), but an
    anchor's damage is the masked model's loss increase (or KL from dense) on every other position only."""
    tiny, model, calib = sensitive_tiny
    base, cuts, ids, orders = _probe_setup(tiny, calib)
    errors, record = measure_errors(base, ids, 64, cuts, orders, ProbeConfig(128, target, stride=2), progress=False)
    every, _ = measure_errors(base, ids, 64, cuts, orders, ProbeConfig(128, target), progress=False)
    assert record["probe_stride"] == 2
    chunks = [ids[s : s + 64] for s in (0, 64)]

    def scored(m) -> list:
        """Per chunk, the log-probabilities and labels at positions 0, 2, 4, ... (those that predict a token)."""
        with torch.no_grad():
            return [(torch.log_softmax(m(c[None]).logits[0, :-1:2].float(), dim=-1), c[1::2]) for c in chunks]

    def damage(cut, dense) -> float:
        if target == "loss":
            nll = [-float(lp.gather(1, y[:, None]).sum()) for lp, y in cut] + [
                float(lp.gather(1, y[:, None]).sum()) for lp, y in dense
            ]
            return max(0.0, sum(nll))
        return sum(float((p.exp() * (p - q)).sum()) for (p, _), (q, _) in zip(dense, cut, strict=True))

    dense, differs = scored(model), []
    for layer in (1, 2, 3):
        for j in _anchors(cuts[layer]):
            expected = damage(scored(_masked(model, layer, orders[layer], cuts[layer][j], 1)), dense) / 64
            assert errors[layer][j] == pytest.approx(expected, rel=1e-4, abs=1e-7)
            differs.append(errors[layer][j] != pytest.approx(every[layer][j], rel=1e-4))
    assert sum(differs) >= 4  # another position set, other values (a loss "gain" is 0 in both)


def test_a_second_probed_width_is_the_masked_model_and_bends_the_table(sensitive_tiny):
    """``probe_widths`` 2 also probes the FFN width nearest the middle (64 of 32..96): its damage is the masked
    model's loss increase, the narrowest and the dropped layer keep theirs, and the widths between follow the
    block error through both anchors."""
    tiny, model, calib = sensitive_tiny
    base, _, ids, orders = _probe_setup(tiny, calib)
    space = build_space("ffn-heads-depth", base.config, ffn_step=32, ffn_min_fraction=0.25, protect_layers=[])
    cuts = elastic_layer_plans(space, "test")
    one, _ = measure_errors(base, ids, 64, cuts, orders, ProbeConfig(128), progress=False)
    two, record = measure_errors(base, ids, 64, cuts, orders, ProbeConfig(128, widths=2), progress=False)
    assert record["probe_widths"] == 2

    clean = _probe_loss(model, ids)
    for layer in (1, 2, 3):
        row = tuple(cuts[layer])
        narrowest, middle, *dropped = anchor_cuts(row, 2)
        assert (row[narrowest].ffn, row[middle].ffn, row[middle].kv_groups) == (32, 64, 4) and len(dropped) == 1
        expected = max(0.0, _probe_loss(_masked(model, layer, orders[layer], row[middle], 1), ids) - clean)
        assert two[layer][middle] == pytest.approx(expected, rel=1e-4, abs=1e-6)
        for j in (narrowest, *dropped):
            assert two[layer][j] == pytest.approx(one[layer][j], rel=1e-5)
    assert anchor_cuts(tuple(cuts[1]), 1) == [anchor_cuts(tuple(cuts[1]), 2)[0], anchor_cuts(tuple(cuts[1]), 2)[2]]


def test_kv_cuts_alone_are_measured_at_the_fewest_groups(sensitive_tiny):
    """One FFN width (``ffn_min_fraction`` 1): a layer's only cuts are of KV groups. The anchor was "the narrowest
    FFN with the most groups", the whole layer, whose damage is 0, so every entry read 0 and the search took any KV
    cut for free; now it is the fewest groups, its damage the masked model's, and the others follow their shape."""
    tiny, model, calib = sensitive_tiny
    base, _, ids, orders = _probe_setup(tiny, calib)
    space = build_space("ffn-heads", base.config, ffn_min_fraction=1.0, protect_layers=[])
    cuts = elastic_layer_plans(space, "test")
    errors, _ = measure_errors(base, ids, 64, cuts, orders, ProbeConfig(128), progress=False)
    clean = _probe_loss(model, ids)
    for layer in range(4):
        row = tuple(cuts[layer])
        assert {c.ffn for c in row} == {96} and len(row) == 4  # 4, 3, 2, 1 KV groups
        (anchor,) = anchor_cuts(row)
        assert row[anchor].kv_groups == 1
        expected = max(0.0, _probe_loss(_masked(model, layer, orders[layer], row[anchor], 1), ids) - clean)
        assert errors[layer][anchor] == pytest.approx(expected, rel=1e-4, abs=1e-6)
        assert errors[layer][_whole(row)] == 0.0
        assert errors[layer] == sorted(errors[layer])  # fewer groups, at least as much damage
    assert min(max(row) for row in errors[:3]) > 0.01  # was 0 everywhere


def _whole(row) -> int:
    return next(j for j, c in enumerate(row) if (c.ffn, c.kv_groups, c.keep) == (96, 4, True))


@pytest.mark.parametrize("target", ["loss", "kl"])
def test_a_plan_of_whole_layers_conditions_nothing(sensitive_tiny, target):
    """Conditioned on the dense model's own plan, the table is the unconditioned one (with given channel orders,
    and with the activation orders measured in the same walk) and the plan's damage is zero."""
    tiny, _, calib = sensitive_tiny
    base, cuts, ids, orders = _probe_setup(tiny, calib)
    whole = tuple(_whole(row) for row in cuts)
    for given in (orders, None):
        probes = ProbeConfig(128, target, depth=1)
        plain, _ = measure_errors(base, ids, 64, cuts, given, probes, progress=False)
        planned, record = measure_errors(base, ids, 64, cuts, given, probes, progress=False, plan=whole)
        # (loss: a difference of two float32 losses of a few nats; float32 resolves ~5e-7 there. 2.4e-7 seen on AVX2)
        assert record["conditioned_on"] == list(whole) and record["plan_damage"] == pytest.approx(0.0, abs=1e-6)
        for got, expected in zip(planned, plain, strict=True):
            assert got == pytest.approx(expected, rel=1e-4, abs=1e-7)


def test_a_plan_conditioned_table_is_the_masked_plan_with_one_layer_changed(sensitive_tiny):
    """With layer 1 at its narrowest width and layer 3 dropped, an anchor's damage is the masked plan's loss with
    that layer changed less the plan's loss with that layer whole (whole model, not streamed); where the plan's
    own cut is the anchor, the walked stream is the measurement. ``plan_damage`` is the plan's loss increase."""
    tiny, model, calib = sensitive_tiny
    base, cuts, ids, orders = _probe_setup(tiny, calib)
    plan = [_whole(row) for row in cuts]
    plan[1], plan[3] = _anchors(cuts[1])[0], _anchors(cuts[3])[1]
    errors, record = measure_errors(base, ids, 64, cuts, orders, ProbeConfig(128), progress=False, plan=tuple(plan))

    def planned(changes: dict[int, int]):
        masked = model
        for layer, j in enumerate(plan):
            j = changes.get(layer, j)
            if j != _whole(cuts[layer]):
                masked = _masked(masked, layer, orders[layer], cuts[layer][j], 1)
        return _probe_loss(masked, ids)

    assert record["plan_damage"] == pytest.approx(planned({}) - _probe_loss(model, ids), rel=1e-4)
    _, short = measure_errors(base, ids, 64, cuts, orders, ProbeConfig(100), progress=False, plan=tuple(plan))
    masked = _masked(_masked(model, 1, orders[1], cuts[1][plan[1]], 1), 3, orders[3], cuts[3][plan[3]], 1)
    clean = _probe_loss(model, ids, 100)  # 100 probe tokens: the plan's damage and the clean loss on those alone,
    assert short["probe_clean_loss"] == pytest.approx(clean, rel=1e-5)  # not on the 128 of two whole chunks
    assert short["plan_damage"] == pytest.approx(_probe_loss(masked, ids, 100) - clean, rel=1e-4)
    for layer in (1, 2, 3):
        zero = planned({layer: _whole(cuts[layer])})
        for j in _anchors(cuts[layer]):
            expected = max(0.0, planned({layer: j}) - zero)
            assert errors[layer][j] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    unconditioned, _ = measure_errors(base, ids, 64, cuts, orders, ProbeConfig(128), progress=False)
    assert errors[2][_anchors(cuts[2])[0]] != pytest.approx(unconditioned[2][_anchors(cuts[2])[0]], rel=1e-3)


def test_scaled_errors_are_piecewise_linear_in_the_block_error():
    from nsc_prune.hf.score.probes import scaled_errors

    row = tuple(LayerPlan(ffn=w, kv_groups=1) for w in (4, 3, 2, 1)) + (LayerPlan(ffn=0, kv_groups=0, keep=False),)
    shape = [0.0, 0.1, 0.2, 0.4, 9.0]  # block errors; the dropped layer's is never used
    assert scaled_errors(shape, {3: 2.0, 4: 5.0}, row) == pytest.approx([0.0, 0.5, 1.0, 2.0, 5.0])  # one line
    bent = scaled_errors(shape, {3: 2.0, 2: 1.6, 4: 5.0}, row)  # the middle anchor lies above that line
    assert bent == pytest.approx([0.0, 0.8, 1.6, 2.0, 5.0])
    flat = scaled_errors(shape, {3: 1.0, 2: 1.6, 4: 5.0}, row)  # a noisy narrowest below the middle: never less
    assert flat == pytest.approx([0.0, 0.8, 1.6, 1.6, 5.0])
    wider = (*row[:4], LayerPlan(ffn=1, kv_groups=0))  # an option past the last anchor's block error
    assert scaled_errors([0.0, 0.1, 0.2, 0.4, 0.8], {3: 2.0, 2: 1.6}, wider)[4] == pytest.approx(4.0)


def test_the_probes_grow_linearly_with_depth():
    """Summed over layers, probe tokens x layers carried is at most ``probe_depth`` layers of ``probe_tokens``
    per layer (plus the floor), against L^2/2 uncapped; the last ``probe_depth`` layers keep every probe token."""
    from nsc_prune.hf.score.probes import MIN_PROBE_TOKENS, probe_token_count

    for layers in (4, 30, 32, 80):
        counts = [probe_token_count(512, 8, layers - 1 - i) for i in range(layers)]
        steps = sum(count * (layers - 1 - i) for i, count in enumerate(counts))
        assert counts[-9:] == [512] * min(9, layers) and all(MIN_PROBE_TOKENS <= c <= 512 for c in counts)
        assert steps <= 512 * 8 * layers + 8  # ceil() adds at most one token a layer
        uncapped = sum(probe_token_count(512, 0, layers - 1 - i) * (layers - 1 - i) for i in range(layers))
        assert uncapped == 512 * layers * (layers - 1) // 2
    assert probe_token_count(512, 8, 200) == MIN_PROBE_TOKENS  # the floor


def test_the_kl_target_equals_the_masked_model_divergence_from_dense(sensitive_tiny):
    """``target="kl"``: the anchors' damage is KL(dense || masked) per predicted probe token, computed here with
    the whole model; no label enters, and it is never negative."""
    tiny, model, calib = sensitive_tiny
    base, cuts, ids, orders = _probe_setup(tiny, calib)
    errors, _ = measure_errors(base, ids, 64, cuts, orders, ProbeConfig(128, "kl"), progress=False)
    chunks = [ids[s : s + 64] for s in (0, 64)]

    def log_probs(m):
        with torch.no_grad():
            return [torch.log_softmax(m(c[None]).logits[0, :-1].float(), dim=-1) for c in chunks]

    dense = log_probs(model)
    for layer in (1, 2, 3):
        row = cuts[layer]
        narrowest, dropped = _anchors(row)
        for j in (narrowest, dropped):
            cut = log_probs(_masked(model, layer, orders[layer], row[j], 1))
            kl = sum(float((p.exp() * (p - q)).sum()) for p, q in zip(dense, cut, strict=True)) / 126
            assert errors[layer][j] == pytest.approx(kl, rel=1e-4, abs=1e-7) and kl > 0
    assert SensitivityConfig(str(calib), target="loss") != SensitivityConfig(str(calib))
    assert SensitivityConfig(str(calib)) == SensitivityConfig(str(calib), target="kl", probe_widths=2)
    assert SensitivityConfig(str(calib), target="loss").probe_widths == 1  # a middle anchor on the labels can gain
    with pytest.raises(Exception, match="target must be one of loss, kl"):
        SensitivityConfig(str(calib), target="ce")


def _search(tmp_path, tiny, calib, budget: str, *extra: str, out: str = "plan", ffn_step: int = 16) -> dict:
    argv = ["--model", str(tiny.base), "--space", "ffn-grid", "--set", f"ffn_step={ffn_step}",
            "--set", "ffn_min_fraction=0.25", "--budget", budget, "--out", str(tmp_path / out), "--no-plot",
            *extra]  # fmt: skip
    assert main(argv) == 0
    return json.loads((tmp_path / out / "pareto.json").read_text())


def _widths(doc: dict) -> list[int]:
    return [layer["ffn"] for layer in doc["points"][doc["selected"]]["layers"]]


def test_a_sensitive_layer_is_kept_wider_than_psi_mp_keeps_it(sensitive_tiny, tmp_path, monkeypatch):
    tiny, _, calib = sensitive_tiny
    monkeypatch.setenv("NSC_PRUNE_CACHE", str(tmp_path / "cache"))
    measured = _search(
        tmp_path, tiny, calib, "80%", "--score", "measured", "--weights", str(tiny.base), "--calib", str(calib),
        "--calib-seq-len", "64", "--quiet", out="measured",
    )  # fmt: skip
    closed_form = _search(tmp_path, tiny, calib, "80%", out="mp")
    m, mp = _widths(measured), _widths(closed_form)
    assert sum(m) < 4 * 96 and sum(mp) < 4 * 96  # the budget cuts
    assert m[2] > max(m[i] for i in (0, 1, 3)) and m[2] > mp[2]  # the measured plan keeps layer 2 widest
    assert mp[2] <= max(mp[i] for i in (0, 1, 3))  # psi_MP cannot tell it from the others
    score = measured["score"]
    assert score["backend"] == "measured" and score["selection"] == "activation"
    assert score["calib_sha256"] and score["calib_tokens"] > 0 and score["seconds"] > 0 and not score["cache_hit"]


def test_the_cli_measures_kl_by_default_loss_when_asked_and_refuses_measured_flags_without_a_measured_score(
    sensitive_tiny, tmp_path, monkeypatch, capsys
):
    tiny, _, calib = sensitive_tiny
    monkeypatch.setenv("NSC_PRUNE_CACHE", str(tmp_path / "cache"))
    common = ("--score", "measured", "--weights", str(tiny.base), "--calib", str(calib), "--calib-seq-len", "64")
    kl = _search(tmp_path, tiny, calib, "80%", *common, "--quiet", out="kl")
    assert kl["score"]["measure"].startswith("KL divergence") and _widths(kl)[2] == max(_widths(kl))
    assert kl["score"]["probe_widths"] == 2 and kl["score"]["probe_depth"] == 6 and kl["score"]["probe_stride"] == 2
    loss = _search(tmp_path, tiny, calib, "80%", *common, "--sensitivity-target", "loss", "--quiet", out="loss")
    assert loss["score"]["measure"].startswith("LM loss increase") and loss["score"]["probe_widths"] == 1
    argv = ["--model", str(tiny.base), "--budget", "80%", "--sensitivity-target", "loss", "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    assert "--sensitivity-target applies to --score measured" in capsys.readouterr().err
    for flag, value in (("--probe-depth", "4"), ("--probe-widths", "1"), ("--probe-stride", "1")):
        assert main([*argv[:4], flag, value, *argv[6:]]) == 2
        assert f"{flag} applies to --score measured" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_refine_solves_again_on_the_plan_conditioned_table_and_keeps_the_least_damaged_plan(
    sensitive_tiny, tmp_path, monkeypatch, capsys
):
    """--refine N: round 1 is conditioned on the unrefined plan, each later round on the plan the last one chose,
    until a plan repeats; the selected point is the measured plan with the least damage (here not the unrefined
    one), within the budget; a second run reads every table from the cache; the flag needs a measured score."""
    from nsc_prune.hf.score import sensitivity

    tiny, _, calib = sensitive_tiny
    monkeypatch.setenv("NSC_PRUNE_CACHE", str(tmp_path / "cache"))
    common = ("--score", "measured", "--weights", str(tiny.base), "--calib", str(calib), "--calib-seq-len", "64",
              "--quiet")  # fmt: skip
    plain = _search(tmp_path, tiny, calib, "80%", *common, out="plain")
    refined = _search(tmp_path, tiny, calib, "80%", *common, "--refine", "4", out="refined")
    refinement = refined["score"]["refinement"]
    rounds = refinement["rounds"]
    grid = [16 * k for k in range(6, 0, -1)]  # the space's widths, widest first (ffn_step 16, down to 25 %)
    assert [grid[j] for j in rounds[0]["plan"]] == _widths(plain)
    assert 2 <= len(rounds) <= 4 and refinement["converged"] == (rounds[-1]["layers_changed"] == 0)
    for before, after in zip(rounds, rounds[1:]):
        assert before["layers_changed"] > 0 and after["plan"] not in [r["plan"] for r in rounds[: rounds.index(after)]]
    best = min(rounds, key=lambda r: r["plan_damage"])
    assert refinement["plan"] == best["plan"] != rounds[0]["plan"]
    assert [grid[j] for j in best["plan"]] == _widths(refined)
    assert best["plan_damage"] < rounds[0]["plan_damage"]
    assert refined["points"][refined["selected"]]["params"] <= refined["budget"]["resolved"]
    assert "refinement: " in capsys.readouterr().out

    walks = []
    real = sensitivity.measure_errors
    monkeypatch.setattr(sensitivity, "measure_errors", lambda *a, **k: walks.append(1) or real(*a, **k))
    again = _search(tmp_path, tiny, calib, "80%", *common, "--refine", "4", out="again")
    assert not walks and all(r["cache_hit"] for r in again["score"]["refinement"]["rounds"])
    assert _widths(again) == _widths(refined)
    argv = ["--model", str(tiny.base), "--budget", "80%", "--out", str(tmp_path / "x")]
    for extra in (("--refine", "1"), (*common, "--refine", "-1")):
        assert main([*argv, *extra]) == 2
        assert "--refine" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_the_measured_value_is_named_damage_wherever_a_person_reads_it(sensitive_tiny, tmp_path, monkeypatch, capsys):
    """Under --score measured pareto.json keeps the key ``nsc`` (minus the damage); the summary, the front line and
    pareto.png's axis and legend call it predicted damage and show the damage itself, never NSC."""
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    tiny, _, calib = sensitive_tiny
    monkeypatch.setenv("NSC_PRUNE_CACHE", str(tmp_path / "cache"))
    seen = {}

    def savefig(fig, *args, **kwargs):
        ax = fig.axes[0]
        seen.update(ylabel=ax.get_ylabel(), title=ax.get_title(), legend=ax.get_legend_handles_labels()[1])
        seen["ys"] = list(ax.lines[0].get_ydata())

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    capsys.readouterr()
    argv = ["--model", str(tiny.base), "--space", "ffn-grid", "--set", "ffn_step=16", "--budget", "80%", "--score",
            "measured", "--weights", str(tiny.base), "--calib", str(calib), "--calib-seq-len", "64", "--quiet",
            "--out", str(tmp_path / "m"), "--plot"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "m" / "pareto.json").read_text())
    damage = -doc["points"][doc["selected"]]["nsc"]
    summary = next(line for line in out.splitlines() if line.startswith("params "))
    front = next(line for line in out.splitlines() if line.startswith("front: "))
    assert f"predicted damage {damage:.4g} nats" in summary and "NSC" not in summary
    assert "minimising predicted damage" in front and "NSC" not in front
    assert seen["ylabel"] == "predicted damage (nats)" and "NSC" not in seen["title"]
    assert any("predicted damage" in label for label in seen["legend"])
    assert seen["ys"] == pytest.approx([-p["nsc"] for p in doc["points"]])


def test_the_cached_table_is_reused_and_rebuilt_when_its_inputs_change(sensitive_tiny, tmp_path, monkeypatch):
    from nsc_prune.hf.score import sensitivity

    tiny, _, calib = sensitive_tiny
    monkeypatch.setenv("NSC_PRUNE_CACHE", str(tmp_path / "cache"))
    walks = []
    real = sensitivity.measure_errors
    monkeypatch.setattr(sensitivity, "measure_errors", lambda *a, **k: walks.append(1) or real(*a, **k))
    args = [
        "--score",
        "measured",
        "--weights",
        str(tiny.base),
        "--calib",
        str(calib),
        "--calib-seq-len",
        "64",
        "--quiet",
    ]
    first = _search(tmp_path, tiny, calib, "80%", *args, out="a")
    second = _search(tmp_path, tiny, calib, "75%", *args, out="b")
    assert len(walks) == 1 and second["score"]["cache_hit"] and second["score"]["table"] == first["score"]["table"]
    copy = tmp_path / "copy.txt"  # the same text at another path: the cached table, recorded with this run's path
    copy.write_text(calib.read_text())
    third = _search(tmp_path, tiny, calib, "75%", *[str(copy) if a == str(calib) else a for a in args], out="b2")
    assert len(walks) == 1 and third["score"]["cache_hit"] and third["score"]["calib"] == str(copy.resolve())
    crlf = tmp_path / "crlf.txt"  # read as the same text: the cached table, recorded with this file's digest
    crlf.write_bytes(calib.read_bytes().replace(b"\n", b"\r\n"))
    fourth = _search(tmp_path, tiny, calib, "75%", *[str(crlf) if a == str(calib) else a for a in args], out="b3")
    assert len(walks) == 1 and fourth["score"]["cache_hit"]  # a CRLF copy was measured again
    from nsc_prune._io import sha256_file
    from nsc_prune.hf.cut.selection import calibration_sha256

    assert fourth["score"]["calib_sha256"] == calibration_sha256(crlf) == first["score"]["calib_sha256"]
    other = tmp_path / "other.txt"  # with a byte-order mark: recorded by its text's digest, as the key takes it
    other.write_bytes(b"\xef\xbb\xbf" + calib.read_text()[: len(calib.read_text()) // 2 + 1].encode())
    fifth = _search(tmp_path, tiny, calib, "80%", *[str(other) if a == str(calib) else a for a in args], out="c")
    assert len(walks) == 2  # another calibration text
    assert fifth["score"]["calib_sha256"] == calibration_sha256(other) != sha256_file(other)
    _search(tmp_path, tiny, calib, "80%", *args, "--selection", "magnitude", out="d")
    assert len(walks) == 3  # another selection
    _search(tmp_path, tiny, calib, "80%", *args, out="e", ffn_step=32)
    assert len(walks) == 4  # another grid
    _search(tmp_path, tiny, calib, "70%", *args, out="f")
    assert len(walks) == 4  # the first table again, still cached


def test_a_corrupt_cache_is_rebuilt_and_a_foreign_table_refused(sensitive_tiny, tmp_path, monkeypatch, capsys):
    """A corrupt cache entry is measured again; an explicit --sensitivity-table that is not a table (a file of the
    user's) or was measured for other inputs is refused in one line and left as it was."""
    tiny, _, calib = sensitive_tiny
    monkeypatch.setenv("NSC_PRUNE_CACHE", str(tmp_path / "cache"))
    table = tmp_path / "table.json"
    args = ["--score", "measured", "--weights", str(tiny.base), "--calib", str(calib), "--calib-seq-len", "64",
            "--quiet", "--sensitivity-table", str(table)]  # fmt: skip
    first = _search(tmp_path, tiny, calib, "80%", *args, out="a")
    assert not first["score"]["cache_hit"] and table.is_file()
    capsys.readouterr()
    _search(tmp_path, tiny, calib, "80%", *args, out="a2")
    assert f"sensitivity table {table}: read from the file," in capsys.readouterr().out  # it said "the cache"
    monkeypatch.chdir(tmp_path)  # a relative path was recorded as typed: read elsewhere, it named another file
    assert _search(tmp_path, tiny, calib, "80%", *args[:-1], "table.json", out="a3")["score"]["table"] == str(table)
    cached = [a for a in args if a not in ("--sensitivity-table", str(table))]
    _search(tmp_path, tiny, calib, "80%", *cached, out="g")
    _search(tmp_path, tiny, calib, "80%", *cached, out="g2")
    assert ": read from the cache," in capsys.readouterr().out
    (entry,) = (tmp_path / "cache" / "sensitivity").glob("*.json")
    entry.write_text(entry.read_text()[:100])  # truncated
    capsys.readouterr()
    rebuilt = _search(tmp_path, tiny, calib, "80%", *cached, out="b")
    assert "unreadable" in capsys.readouterr().err and not rebuilt["score"]["cache_hit"]
    assert _widths(rebuilt) == _widths(first)
    entry.unlink()
    entry.mkdir()  # a folder where the cache keeps the table: refused before measuring, not at the write
    assert main(["--model", str(tiny.base), "--space", "ffn-grid", "--set", "ffn_step=16", "--set",
                 "ffn_min_fraction=0.25", "--budget", "80%", "--out", str(tmp_path / "i"), *cached]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert f"the cache entry {entry} is a folder" in err and len(err.strip().splitlines()) == 1, err
    entry.rmdir()
    shutil.rmtree(tmp_path / "cache" / "sensitivity")
    (tmp_path / "cache" / "sensitivity").write_text("")  # a file where the cache's folder goes
    assert main(["--model", str(tiny.base), "--space", "ffn-grid", "--set", "ffn_step=16", "--set",
                 "ffn_min_fraction=0.25", "--budget", "80%", "--out", str(tmp_path / "i"), *cached]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "the cache folder" in err and "sensitivity is a file" in err and not (tmp_path / "i").exists(), err
    (tmp_path / "cache" / "sensitivity").unlink()
    mine = tmp_path / "notes.json"
    mine.write_text("my notes")
    argv = ["--model", str(tiny.base), "--space", "ffn-grid", "--set", "ffn_step=16", "--set", "ffn_min_fraction=0.25",
            "--budget", "80%", "--out", str(tmp_path / "h"), *args[:-1], str(mine)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "is not a sensitivity table" in err and len(err.strip().splitlines()) == 1, err
    assert mine.read_text() == "my notes" and not (tmp_path / "h").exists()
    before = table.read_text()
    argv = ["--model", str(tiny.base), "--space", "ffn-grid", "--set", "ffn_step=32", "--budget", "90%",
            "--out", str(tmp_path / "c"), *args]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "was measured for other inputs (different grid_sha256)" in err and len(err.strip().splitlines()) == 1
    assert table.read_text() == before and not (tmp_path / "c").exists()
    argv = ["--model", str(tiny.base), "--space", "ffn-grid", "--set", "ffn_step=16", "--set", "ffn_min_fraction=0.25",
            "--budget", "80%", "--out", str(tmp_path / "c"), *args, "--probe-widths", "1"]  # fmt: skip
    assert main(argv) == 2  # a setting only the stored key has (a one-width table's key leaves probe_widths out)
    err = capsys.readouterr().err
    assert "was measured for other inputs (different probe_widths)" in err  # was "(different )"
    assert table.read_text() == before and not (tmp_path / "c").exists()


def test_bad_input_is_one_line_and_writes_nothing(sensitive_tiny, tiny_llama, tmp_path, monkeypatch, capsys):
    tiny, _, calib = sensitive_tiny
    monkeypatch.setenv("NSC_PRUNE_CACHE", str(tmp_path / "cache"))
    short = tmp_path / "short.txt"
    short.write_text("w5 w6 w7")
    other = tiny_llama(lora=False, hidden=32, heads=2)
    inputs = ["--calib", str(calib), "--weights", str(tiny.base)]
    table = str(tmp_path / "tables" / "table.json")
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "notes").write_text("mine")
    (tmp_path / "tables").mkdir()
    cases = {
        "has only 3 tokens; calibration needs at least 64": ["--calib", str(short), "--weights", str(tiny.base)],
        "is another model: its config.json has": ["--calib", str(calib), "--weights", str(other.base)],
        "needs --calib FILE": ["--weights", str(tiny.base)],
        "needs --weights": ["--calib", str(calib)],
        "--calib-seq-len must be at least 2 for --score measured": [*inputs, "--calib-seq-len", "1"],  # was all 0
        # a table path is checked before measuring: a pipe was replaced by a file, the others failed after
        "argument --sensitivity-table: must name a file or folder; got ''": [*inputs, "--sensitivity-table="],
        "is not a regular file (a device, pipe or socket)": [*inputs, "--sensitivity-table", str(tmp_path / "pipe")],
        "tables is a folder; name the file to write": [*inputs, "--sensitivity-table", str(tmp_path / "tables")],
        "notes is a file where a folder is needed": [*inputs, "--sensitivity-table", str(tmp_path / "notes" / "t")],
        # a budget is checked before measuring: the table was measured (hours at 70B) and written, then refused
        "--budget must be at most the full model's": [*inputs, "--budget", "120%", "--sensitivity-table", table],
        "--budget must be at least the smallest plan's": [*inputs, "--budget", "1%", "--sensitivity-table", table],
    }
    spoilt = tiny_llama(lora=False)
    spoil_weight(spoilt.base, "model.layers.1.mlp.up_proj.weight")  # every damage was NaN, read as 0: any plan
    spoilt_message = "outputs on the calibration text are not finite (NaN or inf) in float32: check the weights"
    cases[spoilt_message] = ["--calib", str(calib), "--weights", str(spoilt.base), "--model", str(spoilt.base)]
    for message, extra in cases.items():
        capsys.readouterr()
        argv = ["--model", str(tiny.base), "--space", "ffn-grid", "--set", "ffn_step=32", "--budget", "90%",
                "--score", "measured", "--out", str(tmp_path / "out"), "--quiet", *extra]  # fmt: skip
        assert main(argv) == 2, message
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    argv = ["--model", str(tiny.base), "--space", "lonas", "--budget", "80%", "--score", "measured", "--weights",
            str(tiny.base), "--calib", str(calib), "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 2
    assert "supports the elastic spaces" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache" / "sensitivity").exists()
    assert stat.S_ISFIFO((tmp_path / "pipe").stat().st_mode) and (tmp_path / "notes").read_text() == "mine"
    assert not os.path.exists(table)


def test_sensitivity_config_validates():
    for tokens in (0, 1):  # 1 was accepted, and every probe stream was empty: a table of zeros
        with pytest.raises(
            Exception, match=rf"probe_tokens must be an integer >= 2 \(a next token to predict\); got {tokens}"
        ):
            SensitivityConfig("c.txt", probe_tokens=tokens)
    with pytest.raises(Exception, match="selection must be one of"):
        SensitivityConfig("c.txt", selection="random")
    with pytest.raises(Exception, match="probe_depth must be a non-negative integer"):
        SensitivityConfig("c.txt", probe_depth=-1)
    with pytest.raises(Exception, match="probe_widths must be 1 or 2"):
        SensitivityConfig("c.txt", probe_widths=3)
    with pytest.raises(Exception, match="probe_stride must be a positive integer"):
        SensitivityConfig("c.txt", probe_stride=0)
    with pytest.raises(Exception, match="probe_depth must be a non-negative integer"):
        ProbeConfig(depth=-1)
    assert SensitivityConfig("c.txt").probe_config() == ProbeConfig(512, "kl", depth=6, widths=2, stride=2)
    assert SensitivityConfig("c.txt", target="loss").probe_config().widths == 1


@pytest.mark.parametrize(
    "family", ["granite", "llama", "mistral", "qwen2", "qwen3", "smollm3", "olmo2", "gemma2", "gemma3_text", "phi3"]
)
def test_every_model_type_measures_the_masked_loss(tmp_path, family):
    """llama (with attention and MLP biases), mistral, qwen2 (q/k/v biases), qwen3 (q/k norms), granite (embedding,
    residual and attention multipliers, logits_scaling), smollm3 (layers without RoPE), olmo2 (norms after attention
    and the MLP; FFN cuts only, NO_KV_CUTS) and phi3 (fused gate_up_proj, partial rotary, LongRoPE): the block rebuilt
    from its parts passes the check, the streamed clean loss is the model's, and the narrowest cut's damage is the
    masked model's loss increase (the down_proj bias stays, as in extraction)."""
    from test_extract_model_types import build_tiny
    from test_extract_phi3 import build_phi3

    folder = build_phi3(tmp_path) if family == "phi3" else build_tiny(tmp_path, family, lora=False).base
    base = open_base(folder)
    space = build_space("ffn-grid" if family == "olmo2" else "ffn-heads", base.config, ffn_step=32)
    cuts = elastic_layer_plans(space, "test")
    ids = torch.randint(3, 128, (128,), generator=torch.Generator().manual_seed(0))
    orders = [LayerOrder.identity(96, 2)] * 4
    errors, record = measure_errors(base, ids, 64, cuts, orders, ProbeConfig(64), progress=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def loss(m) -> float:
        with torch.no_grad():
            return float(torch.nn.functional.cross_entropy(m(ids[None, :64]).logits[0, :-1], ids[1:64]))

    assert record["probe_clean_loss"] == pytest.approx(loss(model), rel=1e-5)
    row = cuts[2]
    narrowest = min(range(len(row)), key=lambda j: (row[j].ffn, -row[j].kv_groups))
    expected = max(0.0, loss(_masked(model, 2, orders[2], row[narrowest], 2)) - loss(model))
    assert errors[2][narrowest] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert all(math.isfinite(e) and e >= 0 for layer in errors for e in layer)


def test_a_harmless_cut_never_drops_the_full_model_from_the_front(tiny_llama, tmp_path, monkeypatch):
    """A measured gain is clamped to no damage; the full model must still be the front's costliest point, so
    ``--budget 80%`` is 80 % of the full model under every score, and extraction reads the same percentage."""
    from nsc_prune.hf.score import sensitivity
    from nsc_prune.hf.score.sensitivity import SensitivityConfig, SensitivityTable
    from nsc_prune.planning import ScoreSettings, search_plan

    tiny = tiny_llama(lora=False, layers=4)
    overrides = {"ffn_step": 16, "ffn_min_fraction": 0.25}
    space = build_space("ffn-grid", open_base(tiny.base).config, **overrides)
    cuts = elastic_layer_plans(space, "test")
    full_ffn = max(c.ffn for c in cuts[0])
    # layers 1 and 3 measured harmless at every width (a gain, clamped to 0); layers 0 and 2 hurt when cut
    errors = [[0.0 if i in (1, 3) else 0.1 * (full_ffn - c.ffn) / full_ffn for c in row] for i, row in enumerate(cuts)]
    table = SensitivityTable(tuple(map(tuple, cuts)), tuple(map(tuple, errors)), {"table": "test", "cache_hit": True})
    monkeypatch.setattr(sensitivity, "sensitivity_table", lambda *args, **kwargs: table)

    calib = tmp_path / "unread.txt"  # checked (a text file), never read: the table is given
    calib.write_text("w3 w4 w5")
    found = search_plan(str(tiny.base), "80%", "ffn-grid", overrides=overrides,
                        score=ScoreSettings("measured", str(tiny.base), SensitivityConfig(str(calib))))  # fmt: skip
    closed_form = search_plan(str(tiny.base), "80%", "ffn-grid", overrides=overrides)
    full = closed_form.result.cost_of(closed_form.result.points[-1])
    assert found.result.cost_of(found.result.points[-1]) == full  # the full model stays on the front
    assert found.budget == round(0.8 * full) == closed_form.budget
    doc = found.document
    assert doc.select(budget="80%") == doc.selected  # extraction's reading of the same budget: the same point
    chosen = doc.points[doc.selected]
    widths = [layer["ffn"] for layer in chosen.to_dict()["layers"]]
    assert chosen.params <= found.budget and widths[1::2] != [full_ffn, full_ffn]  # the harmless layers are cut


def test_without_progress_a_measured_search_reads_its_weights_without_a_bar(tiny_llama, tmp_path, monkeypatch):
    """ScoreSettings(progress=False) turned its own bar off, not transformers' "Loading weights" under it."""
    from nsc_prune.hf.progress import is_quiet
    from nsc_prune.hf.score import sensitivity
    from nsc_prune.hf.score.sensitivity import SensitivityTable
    from nsc_prune.planning import ScoreSettings, search_plan

    tiny = tiny_llama(lora=False)
    space = build_space("ffn-grid", open_base(tiny.base).config, ffn_step=32)
    cuts = elastic_layer_plans(space, "test")
    table = SensitivityTable(tuple(map(tuple, cuts)), tuple(tuple(0.0 for _ in row) for row in cuts), {})
    quiet_while_measured = []
    monkeypatch.setattr(
        sensitivity, "sensitivity_table", lambda *a, **k: quiet_while_measured.append(is_quiet()) or table
    )
    calib = tmp_path / "c.txt"
    calib.write_text("w3 w4 w5")
    for progress in (True, False):
        score = ScoreSettings("measured", str(tiny.base), SensitivityConfig(str(calib)), progress=progress)
        search_plan(str(tiny.base), "100%", "ffn-grid", overrides={"ffn_step": 32}, score=score)
    assert quiet_while_measured == [False, True]


@pytest.mark.parametrize("bad", [-0.01, math.nan, math.inf])
def test_a_table_built_with_a_gain_or_a_non_finite_damage_is_refused(bad):
    """Through the API a gain reached the DP: the full model fell off the front, and the search and extract then
    read one percentage as two budgets (76-100 % disagreed at 12 of 25 points on a tiny model)."""
    from nsc_prune.hf.score.sensitivity import SensitivityTable

    cuts = ((LayerPlan(ffn=8), LayerPlan(ffn=4)),)
    SensitivityTable(cuts, ((0.0, 0.2),), {})
    with pytest.raises(InvalidInputError, match="every damage of a sensitivity table must be finite and >= 0"):
        SensitivityTable(cuts, ((0.0, bad),), {})


def test_a_harmless_cut_stays_below_the_whole_layer_at_8b_scale():
    """32 layers whose drop costs 5 nats put the DP's value step near 2e-10: a 1e-9-per-unit nudge of a 256-channel
    cut (2 % of the layer) rounded to 0, the cut tied the whole layer, and the full model fell off the front."""
    from nsc_prune.core.front import search
    from nsc_prune.hf.score.sensitivity import SensitivityTable
    from nsc_prune.presets import resolve_model

    space = build_space("ffn-heads-depth", resolve_model("llama-3-8b").config)
    rows = elastic_layer_plans(space, "test")
    full = rows[5][0]
    gain = next(
        j for j, cut in enumerate(rows[5]) if cut.keep and cut.ffn == full.ffn - 256 and cut.kv_groups == full.kv_groups
    )

    def damage(l: int, j: int, cut) -> float:  # the whole layer and one measured gain 0, a drop 5 nats
        return 0.0 if j == 0 or (l, j) == (5, gain) else 5.0 if not cut.keep else 0.01 + 0.001 * j

    errors = [tuple(damage(l, j, cut) for j, cut in enumerate(row)) for l, row in enumerate(rows)]
    measured = search(space, values=SensitivityTable(tuple(map(tuple, rows)), tuple(errors), {}).values())
    assert measured.points[-1].params == search(space).points[-1].params  # the full model ends the front
    assert dict(measured.points[-1].layers[5])["ffn"] == full.ffn


def test_extract_reads_a_percentage_of_the_full_model_recorded_with_the_front(tiny_llama, tmp_path, monkeypatch):
    """pareto.json records the full model's cost: a front that lacks the full model (a score that rates a cut above
    the whole layer) is read by extract with the search's percentage, not one of its own largest point."""
    from nsc_prune.plan import ParetoDocument

    tiny = tiny_llama(lora=False, layers=4)
    doc = _search(tmp_path, tiny, None, "80%").copy()
    full = doc["cost"]["full"]
    assert full == doc["points"][-1]["params"]
    doc["points"] = doc["points"][:-3]  # as if a score had cut the costliest plans from the front
    read = ParetoDocument.from_dict(doc, "test")
    expected = max(i for i, p in enumerate(doc["points"]) if p["params"] <= round(0.7 * full))
    assert read.select(budget="70%") == expected
    with pytest.raises(ConfigError, match="'cost.full' must be an integer, at least every point"):
        ParetoDocument.from_dict({**doc, "cost": {**doc["cost"], "full": 5}}, "test")


def test_olmo2_measured_refuses_kv_group_cuts_in_one_line(tmp_path):
    """OLMo 2's whole-projection q/k norms leave no exact KV-group cut: a space with one is refused before any
    measuring or writing (FFN cuts and dropped layers are measured: the test above)."""
    from test_extract_model_types import build_tiny

    from nsc_prune.errors import UnsupportedArchitectureError
    from nsc_prune.hf.score.sensitivity import SensitivityConfig, sensitivity_table

    tiny = build_tiny(tmp_path, "olmo2", lora=False)
    space = build_space("ffn-heads", open_base(tiny.base).config, ffn_step=32)
    table = tmp_path / "table.json"
    with pytest.raises(UnsupportedArchitectureError, match=r"^--score measured of olmo2 cannot cut KV groups: [^\n]*$"):
        sensitivity_table(space, tiny.base, tiny.config, SensitivityConfig(str(tmp_path / "c.txt")), table=table)
    assert not table.exists()


def test_the_shrunk_table_moves_every_option_toward_its_mean_over_layers(tiny_llama, tmp_path, monkeypatch, capsys):
    """--sensitivity-shrink W: the DP solves on (1 - W) x the table + W x each option's mean over the layers, by
    hand; 0 is the table, 1 a layer-symmetric one; pareto.json records W; the raw table's record is kept."""
    from nsc_prune.hf.score import sensitivity
    from nsc_prune.hf.score.sensitivity import SensitivityConfig, SensitivityTable
    from nsc_prune.planning import ScoreSettings, search_plan

    tiny = tiny_llama(lora=False, layers=4)
    (tmp_path / "x.txt").write_text("w3 w4 w5")  # checked (a text file), never read: the table is given
    overrides = {"ffn_step": 16, "ffn_min_fraction": 0.25}
    cuts = elastic_layer_plans(build_space("ffn-grid", open_base(tiny.base).config, **overrides), "test")
    full_ffn = max(c.ffn for c in cuts[0])
    scale = (1.0, 0.1, 0.2, 0.05)  # layer 0 hurts most when cut
    errors = [[scale[i] * (full_ffn - c.ffn) / full_ffn for c in row] for i, row in enumerate(cuts)]
    table = SensitivityTable(tuple(map(tuple, cuts)), tuple(map(tuple, errors)), {"table": "t", "cache_hit": True})
    assert table.shrunk(0) is table
    symmetric = table.shrunk(1).errors
    assert all(row == pytest.approx(symmetric[0]) for row in symmetric)
    j = len(cuts[0]) - 1  # the narrowest option: (1 - 0.25) e + 0.25 mean
    assert table.shrunk(0.25).errors[0][j] == pytest.approx(0.75 * errors[0][j] + 0.25 * sum(e[j] for e in errors) / 4)
    assert table.shrunk(0.25).record == {"table": "t", "cache_hit": True, "shrink": 0.25}

    def plan(shrink: float, given: SensitivityTable = table):
        monkeypatch.setattr(sensitivity, "sensitivity_table", lambda *args, **kwargs: given)
        settings = ScoreSettings("measured", str(tiny.base), SensitivityConfig(str(tmp_path / "x.txt")), shrink=shrink)
        doc = search_plan(str(tiny.base), "85%", "ffn-grid", overrides=overrides, score=settings).document
        return [layer["ffn"] for layer in doc.points[doc.selected].to_dict()["layers"]], doc.score

    measured, record = plan(0)
    assert measured[0] == full_ffn and "shrink" not in record
    by_hand = SensitivityTable(table.cuts, table.shrunk(0.5).errors, table.record)
    shrunk, record = plan(0.5)
    assert shrunk == plan(0, by_hand)[0] and record["shrink"] == 0.5
    assert max(plan(1)[0]) - min(plan(1)[0]) < max(measured) - min(measured)  # the symmetric table evens widths

    for bad in (-0.1, 1.5, float("nan"), "0.3"):
        with pytest.raises(ConfigError, match="--sensitivity-shrink must be a number from 0 to 1"):
            ScoreSettings("measured", str(tiny.base), SensitivityConfig(str(tmp_path / "x.txt")), shrink=bad)
    # An option only some layers have (a protected layer keeps its full width alone; a depth space's first layer has
    # no drop) is pooled over those layers: it was refused, and on ffn-heads-depth the refusal could not be avoided.
    uneven = SensitivityTable((table.cuts[0][:1], *table.cuts[1:]), (table.errors[0][:1], *table.errors[1:]), {})
    narrowest = [row[-1] for row in table.errors[1:]]
    assert uneven.shrunk(0.5).errors[0] == (0.0,) and uneven.shrunk(1).errors[1][-1] == pytest.approx(
        sum(narrowest) / 3
    )
    assert [cut.ffn for cut in uneven.cuts[0]] == [full_ffn]
    protected = {**overrides, "protect_layers": [0]}
    monkeypatch.setattr(sensitivity, "sensitivity_table", lambda *args, **kwargs: uneven)
    settings = ScoreSettings("measured", str(tiny.base), SensitivityConfig(str(tmp_path / "x.txt")), shrink=0.5)
    doc = search_plan(str(tiny.base), "85%", "ffn-grid", overrides=protected, score=settings).document
    assert doc.points[doc.selected].to_dict()["layers"][0]["ffn"] == full_ffn and doc.score["shrink"] == 0.5
    argv = ["--model", str(tiny.base), "--budget", "80%", "--sensitivity-shrink", "0.3", "--out", str(tmp_path / "o")]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--sensitivity-shrink applies to --score measured" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
    (tmp_path / "c.txt").write_text("calibration text")
    measured = [
        "--model",
        str(tiny.base),
        "--budget",
        "100%",
        "--space",
        "ffn-grid",
        "--score",
        "measured",
        "--weights",
        str(tiny.base),
    ]
    for init in (["--init", "kaiming"], ["--set", "init=0.02"]):  # the same front, filed under another folder
        assert main([*measured, "--calib", str(tmp_path / "c.txt"), "--out", str(tmp_path / "i"), *init]) == 2
        err = capsys.readouterr().err
        assert "--init (or --set init) applies to psi_MP" in err and len(err.strip().splitlines()) == 1


RECORD = {"calib": "calib.txt", "calib_tokens": 4096, "selection": "activation"}  # what the search reports


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"record": {}}, "its record lacks calib, calib_tokens, selection"),  # a KeyError after pareto.json
        ({"key": {"k": 1, "conditioned_on": [0, 1]}}, "its record lacks plan_damage"),  # refinement's KeyError
        ({"error": 1e308}, r"error 1e\+308 is not a number in \[0, 1e\+06\]"),  # an OverflowError in the DP
        ({"error": float("nan")}, "NaN is not a JSON number"),
        ({"whole": 0.5}, r"the whole layer's error must be 0 \(nothing cut\); got 0.5"),  # the full model fell off
        ({"record": {**RECORD, "probe_clean_loss": float("nan")}}, "NaN is not a JSON number"),  # pareto.json failed
        ({"record": {**RECORD, "seconds": "x", "built": "x"}}, "its record lacks seconds, built"),  # into pareto.json
    ],
    ids=["no-record", "conditioned-without-damage", "huge", "nan", "whole-layer-damaged", "nan-record", "seconds"],
)
def test_a_hand_edited_table_the_search_cannot_use_is_refused_before_it(tmp_path, edit, message):
    from nsc_prune.hf.score.sensitivity_cache import cached_table, write_table

    cuts = [[LayerPlan(ffn=16), LayerPlan(ffn=8)]] * 2
    key = edit.get("key", {"k": 1})
    path = tmp_path / "table.json"
    write_table(path, key, cuts, [[0.0, 0.1], [0.0, 0.2]], {**RECORD, "plan_damage": 0.3})
    assert cached_table(path, key, cuts, explicit=True)[0] == [[0.0, 0.1], [0.0, 0.2]]
    data = json.loads(path.read_text())
    data["record"] = edit.get("record", {**RECORD} if "key" in edit else data["record"])
    data["layers"][1][1]["error"] = edit.get("error", 0.2)
    data["layers"][1][0]["error"] = edit.get("whole", 0.0)
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=f"is not a sensitivity table \\(.*{message}"):
        cached_table(path, key, cuts, explicit=True)


@pytest.mark.parametrize(
    "layers, message",
    [  # each was a TypeError or an AttributeError's message
        ([1, [{"ffn": 8, "kv_groups": None, "keep": True, "error": 0.1}]], "one entry per option of the space"),
        ([["a"], [{"ffn": 8, "kv_groups": None, "keep": True, "error": 0.1}]], "entry must be an object; got 'a'"),
    ],
)
def test_a_table_of_another_shape_is_unreadable_not_a_traceback(tmp_path, layers, message):
    from nsc_prune.hf.score.sensitivity_cache import cached_table, write_table

    cuts = [[LayerPlan(ffn=8)], [LayerPlan(ffn=8)]]
    path = tmp_path / "table.json"
    write_table(path, {"k": 1}, cuts, [[0.0], [0.0]], RECORD)
    assert cached_table(path, {"k": 1}, cuts, explicit=True)[0] == [[0.0], [0.0]]
    path.write_text(json.dumps({**json.loads(path.read_text()), "layers": layers}))
    with pytest.raises(ConfigError, match=f"is not a sensitivity table \\(.*{message}"):
        cached_table(path, {"k": 1}, cuts, explicit=True)
    with pytest.warns(UserWarning, match="unreadable"):
        assert cached_table(path, {"k": 1}, cuts, explicit=False) is None


def test_settings_that_measure_the_same_table_have_one_key(tiny_llama, tmp_path):
    """A --calib-seq-len past the model's context (128 tokens here) and a --probe-depth of every later layer
    measure what the capped ones do: each was keyed as asked, and the same table measured again."""
    from nsc_prune.hf.score.sensitivity_cache import table_key

    tiny = tiny_llama(lora=False, layers=3)
    base = open_base(tiny.base)
    cuts = elastic_layer_plans(build_space("ffn-grid", tiny.config, ffn_step=32), "test")
    (tmp_path / "calib.txt").write_text("w1 w2 w3")

    def key(**settings):
        return table_key(base, cuts, SensitivityConfig(str(tmp_path / "calib.txt"), **settings))

    assert key(seq_len=128) == key(seq_len=512) == key(seq_len=4096) != key(seq_len=64)
    assert key(probe_depth=0) == key(probe_depth=2) == key(probe_depth=100) != key(probe_depth=1)
    from nsc_prune._io import sha256_file

    (tmp_path / "calib.txt").write_bytes(b"w1 w2\nw3")
    plain = key()
    assert plain["calib_sha256"] == sha256_file(tmp_path / "calib.txt")  # a plain file keeps its tables' key
    for written in (b"\xef\xbb\xbfw1 w2\nw3", b"w1 w2\r\nw3"):  # read as the same text: each was measured again
        (tmp_path / "calib.txt").write_bytes(written)
        assert key() == plain, written


def test_tables_measured_before_the_probe_fixes_are_not_reused(tiny_llama, tmp_path):
    """Rows that cut KV groups alone (their probe was the uncut layer: all 0) and probe tokens that are not whole
    chunks (a plan's damage was taken on the whole chunks) are keyed anew; other tables keep their key."""
    from nsc_prune.hf.score.sensitivity_cache import table_key

    tiny = tiny_llama(lora=False, layers=3)
    base = open_base(tiny.base)
    (tmp_path / "calib.txt").write_text("w1 w2 w3")
    config = SensitivityConfig(str(tmp_path / "calib.txt"), seq_len=64)
    for space, settings, new in (
        ("ffn-grid", {}, set()),
        ("ffn-heads", {}, set()),
        ("ffn-heads", {"ffn_min_fraction": 1.0}, {"kv_alone_probed"}),
        ("ffn-heads-depth", {"ffn_min_fraction": 1.0}, {"kv_alone_probed"}),
    ):
        cuts = elastic_layer_plans(build_space(space, tiny.config, ffn_step=32, **settings), "test")
        assert {"kv_alone_probed", "probed_prefix"} & set(table_key(base, cuts, config)) == new, (space, settings)
    key = table_key(base, cuts, SensitivityConfig(str(tmp_path / "calib.txt"), seq_len=64, probe_tokens=100))
    assert key["probed_prefix"] is True
    every = SensitivityConfig(str(tmp_path / "calib.txt"), seq_len=64, probe_tokens=100, calib_tokens=64)
    assert "probed_prefix" not in table_key(base, cuts, every)  # every calibration token probed, as before


def test_a_table_measured_with_bos_led_chunks_has_its_own_key(tiny_llama, tmp_path):
    """Chunks start with BOS where the tokenizer adds one (``calibration_tokens``): a table measured before that,
    with the same tokenizer files, measured BOS-less text and is not reused. A tokenizer without BOS keeps its key."""
    from nsc_prune.hf.score.sensitivity_cache import table_key
    from tests.conftest import _tokenizer

    tiny = tiny_llama(lora=False, layers=2)
    cuts = elastic_layer_plans(build_space("ffn-grid", tiny.config, ffn_step=48), "test")
    (tmp_path / "calib.txt").write_text("w3 w4 w5")
    config = SensitivityConfig(str(tmp_path / "calib.txt"))
    assert "bos_each_window" not in table_key(open_base(tiny.base), cuts, config)
    _tokenizer(128, bos=True).save_pretrained(tiny.base)
    assert table_key(open_base(tiny.base), cuts, config)["bos_each_window"] is True


def test_two_searches_with_one_new_table_file_both_finish(tiny_llama, tmp_path, monkeypatch):
    """Two searches started at once with the same new --sensitivity-table: the later writer found the file made
    meanwhile and failed after its measurement (exit 2, its table set aside as FILE.kept-1). A table of the same
    inputs there is this run's own; one of other inputs is still never replaced."""
    from nsc_prune.hf.score import sensitivity
    from nsc_prune.hf.score.sensitivity import SensitivityConfig, sensitivity_table

    tiny = tiny_llama(lora=False, layers=2)
    (tmp_path / "calib.txt").write_text(" ".join(f"w{3 + i % 7}" for i in range(600)))
    space = build_space("ffn-grid", tiny.config, ffn_step=48)
    config = SensitivityConfig(str(tmp_path / "calib.txt"), calib_tokens=256, seq_len=64, probe_tokens=64)
    table, real, others = tmp_path / "t.json", sensitivity.measure_errors, []

    def while_another_search_writes(*args, **kwargs):
        measured = real(*args, **kwargs)
        if not others:  # the other search, of the same inputs, finishes first
            others.append(None)
            others[0] = sensitivity_table(space, tiny.base, tiny.config, config, table=table, progress=False)
        return measured

    monkeypatch.setattr(sensitivity, "measure_errors", while_another_search_writes)
    mine = sensitivity_table(space, tiny.base, tiny.config, config, table=table, progress=False)
    assert mine.errors == others[0].errors and not list(tmp_path.glob("t.json.kept*"))


def test_the_probes_through_the_lm_head_have_their_bar(sensitive_tiny, monkeypatch, capsys):
    """A fifth of a table's time (the probe streams through the LM head, after the layers' bar) showed nothing."""
    import sys

    tiny, _, calib = sensitive_tiny
    base, cuts, ids, orders = _probe_setup(tiny, calib)
    monkeypatch.setattr(type(sys.stderr), "isatty", lambda self: True)  # stderr is capsys's
    capsys.readouterr()
    measure_errors(base, ids, 64, cuts, orders, ProbeConfig(128), progress=True)
    assert "sensitivity table: LM head" in capsys.readouterr().err
    measure_errors(base, ids, 64, cuts, orders, ProbeConfig(128), progress=False)
    assert "sensitivity table" not in capsys.readouterr().err


def test_every_setting_that_changes_the_measurement_changes_the_key(tiny_llama, tmp_path):
    """A cached table is reused exactly when its key is equal: each setting that changes what is measured (the
    probe tokens, stride and widths, the calibration tokens, the float type, the weights, the tokenizer, the
    target) must change the key, or another measurement's table is read as this one's."""

    from nsc_prune.hf.score.sensitivity_cache import default_table_path, table_key
    from nsc_prune.hf.weights.compute import Compute
    from tests.conftest import _tokenizer

    tiny = tiny_llama(lora=False, layers=3)
    other = tiny_llama(lora=False, layers=3, seed=1)  # same shapes, other values
    base = open_base(tiny.base)
    cuts = elastic_layer_plans(build_space("ffn-grid", tiny.config, ffn_step=32), "test")
    calib = tmp_path / "calib.txt"
    calib.write_text("w1 w2 w3")

    def key(model=base, **settings):
        return table_key(model, cuts, SensitivityConfig(str(calib), seq_len=64, **settings))

    plain = key()
    for settings in ({"probe_tokens": 256}, {"probe_stride": 1}, {"probe_stride": 4}, {"probe_widths": 1},
                     {"calib_tokens": 1024}, {"compute": Compute("cpu", "bfloat16")}, {"target": "loss"}):  # fmt: skip
        assert key(**settings) != plain, settings
        assert default_table_path(key(**settings)) != default_table_path(plain), settings
    assert key(open_base(other.base)) != plain  # other weights of one shape
    words = tmp_path / "tokenizer"
    shutil.copytree(tiny.base, words)
    _tokenizer(128, bos=False).save_pretrained(words)
    assert key(tokenizer=str(words)) == plain  # the same tokenizer files elsewhere: the same table
    _tokenizer(96, bos=False).save_pretrained(words)  # another vocabulary
    assert key(tokenizer=str(words)) != plain


def test_the_middle_anchor_is_the_width_nearest_the_middle_and_never_the_narrowest():
    """``probe_widths`` 2 probes the FFN width nearest halfway between the narrowest and the full width (of the
    narrowest's KV groups); with no width strictly between, only the narrowest and the drop are probed."""

    drop = LayerPlan(ffn=0, kv_groups=0, keep=False)
    row = (*(LayerPlan(ffn=w, kv_groups=4) for w in (96, 80, 64, 40, 16)), LayerPlan(ffn=16, kv_groups=2), drop)
    narrowest, middle, dropped = anchor_cuts(row, 2)
    assert (row[narrowest], row[middle], dropped) == (LayerPlan(ffn=16, kv_groups=4), LayerPlan(ffn=64, kv_groups=4), 6)
    two = (LayerPlan(ffn=96, kv_groups=4), LayerPlan(ffn=16, kv_groups=4), drop)
    assert anchor_cuts(two, 2) == anchor_cuts(two, 1) == [1, 2]


@pytest.mark.parametrize("family", ["llama", "granite"])
def test_relative_error_sums_are_the_cut_blocks_relative_errors(tmp_path, family):
    """The block-error shape every non-anchor option's damage follows: sum_t ||Y'_t - Y_t||^2 / ||Y_t||^2 of each
    cut's output (``cut_outputs``, pinned to the masked block) over the tokens, and their count; granite's
    residual multiplier scales the removed channels' contribution as the block does."""
    from test_extract_model_types import build_tiny

    from nsc_prune.hf.score.block_error import relative_error_sums

    folder = build_tiny(tmp_path, family, lora=False).base
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    block, seen = model.model.layers[1], {}
    hooks = [
        block.register_forward_pre_hook(
            lambda m, a, k: seen.__setitem__("x", (a[0] if a else k["hidden_states"])[0]), with_kwargs=True
        ),
        block.self_attn.o_proj.register_forward_hook(lambda m, a, o: seen.update(z=a[0][0], attn=o[0])),
        block.register_forward_hook(lambda m, a, o: seen.__setitem__("y", (o[0] if isinstance(o, tuple) else o)[0])),
    ]
    ids = torch.randint(3, 128, (40,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(ids[None], use_cache=False)
    for hook in hooks:
        hook.remove()
    x, z, attn, y = seen["x"], seen["z"], seen["attn"], seen["y"]
    order = LayerOrder(tuple(torch.randperm(96, generator=torch.Generator().manual_seed(1)).tolist()), (1, 0))
    cuts = tuple(
        LayerPlan(ffn=f, kv_groups=g, keep=k)
        for f, g, k in ((96, 2, True), (64, 2, True), (32, 2, True), (96, 1, True), (40, 1, True), (0, 0, False))
    )
    with torch.no_grad():
        sums, tokens = relative_error_sums(block, [(x, z, attn, y)] * 2, order, cuts, 2, "test")
        outputs = dict(cut_outputs(block, x, z, attn, order, cuts, 2))
    assert tokens == 2 * len(y)
    for j in range(len(cuts)):
        expected = 2 * float((((outputs[j] - y) ** 2).sum(-1) / (y**2).sum(-1)).sum())
        assert sums[j] == pytest.approx(expected, rel=1e-4, abs=1e-9), cuts[j]
    assert sums[0] == 0.0 and 0 < sums[1] < sums[2]
    with (
        torch.no_grad(),
        pytest.raises(UnsupportedArchitectureError, match=r"^test: the block's output is not h \+ r post"),
    ):
        relative_error_sums(block, [(x, z, attn, y * 1.01)], order, cuts, 2, "test")  # a block of another form


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"error": -0.1}, r"error -0.1 is not a number in \[0, 1e\+06\]"),  # a gain: refused as a table, not later
        ({"ffn": 12}, "its options are not the space's"),
        ({"seconds": -1.0}, "its record lacks seconds"),
        ({"format": 2}, "not a format-1 sensitivity table"),
    ],
)
def test_a_table_file_with_a_gain_other_options_or_a_negative_time_is_refused(tmp_path, edit, message):
    from nsc_prune.hf.score.sensitivity_cache import cached_table, write_table

    cuts = [[LayerPlan(ffn=16), LayerPlan(ffn=8)]] * 2
    record = {"calib": "calib.txt", "calib_tokens": 4096, "selection": "activation", "seconds": 1.0}
    path = tmp_path / "table.json"
    write_table(path, {"k": 1}, cuts, [[0.0, 0.1], [0.0, 0.2]], record)
    data = json.loads(path.read_text())
    data["layers"][1][1]["error"] = edit.get("error", 0.2)
    data["layers"][1][1]["ffn"] = edit.get("ffn", 8)
    data["record"]["seconds"] = edit.get("seconds", 1.0)
    data["format"] = edit.get("format", 1)
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=f"is not a sensitivity table \\(.*{message}"):
        cached_table(path, {"k": 1}, cuts, explicit=True)
    with pytest.warns(UserWarning, match="unreadable"):  # a cache entry: measured again, not a traceback later
        assert cached_table(path, {"k": 1}, cuts, explicit=False) is None


def test_the_sensitivity_cache_keeps_the_paths_of_tables_measured_before(tmp_path, monkeypatch):
    """A table's cache file is named by its key's digest (fields in sorted order) and the grid by its compact JSON:
    a change of either misses every table already measured (hours each at 70B), as psi_W pins its cache names."""
    import hashlib
    from types import SimpleNamespace

    from nsc_prune.hf.score import sensitivity_cache

    monkeypatch.setenv("NSC_PRUNE_CACHE", str(tmp_path))
    path = sensitivity_cache.default_table_path({"weights": "w", "format": 1, "grid_sha256": "g"})
    assert path == tmp_path / "sensitivity" / "8a1b6a3a0442c39d4511a1f3d9e5e1d6.json"
    for name in ("weights_fingerprint", "tokenizer_fingerprint", "calibration_sha256", "calibration_bos"):
        monkeypatch.setattr(sensitivity_cache, name, lambda *a: None)
    monkeypatch.setattr(sensitivity_cache, "calibration_seq_len", lambda base, n: n)
    cuts = [[LayerPlan(ffn=16, kv_groups=2), LayerPlan(ffn=8, kv_groups=1), LayerPlan(ffn=0, kv_groups=0, keep=False)]]
    key = sensitivity_cache.table_key(SimpleNamespace(folder=tmp_path, tensors={}), cuts, SensitivityConfig("c.txt"))
    assert key["grid_sha256"] == hashlib.sha256(b"[[[16,2,true],[8,1,true],[0,0,false]]]").hexdigest()


def test_the_kl_of_a_large_vocabulary_is_the_float64_divergence():
    """At a real model's vocabulary float32 probabilities do not sum to 1; the KL target corrects for it (about 1e-4
    nats a position otherwise), so the summed KL equals the float64 one."""
    from nsc_prune.hf.score.probes import _clean_references, _kl_sums

    generator = torch.Generator().manual_seed(0)
    vocab, dim, positions = 50_000, 16, 33
    head = torch.randn(vocab, dim, generator=generator)
    dense = torch.randn(1, positions + 1, dim, generator=generator)
    cut = dense + 0.3 * torch.randn(1, positions + 1, dim, generator=generator)
    (reference,) = _clean_references(lambda t: t, head, [dense], [0], None, positions + 1, None, "kl")
    got = _kl_sums(reference, (cut[0, :-1] @ head.T).float())
    log_p = torch.log_softmax((dense[0, :-1] @ head.T).double(), -1)
    log_q = torch.log_softmax((cut[0, :-1] @ head.T).double(), -1)
    expected = float((log_p.exp() * (log_p - log_q)).sum())
    assert got == pytest.approx(expected, rel=2e-5)


def test_a_measured_gain_is_no_damage_and_a_zero_block_error_stays_zero():
    """An anchor that lowers the loss (noise on the labels, or under a plan less than the plan's own whole layer) is
    clamped to 0: a negative damage would be refused by SensitivityTable after the whole measurement. An anchor
    whose block error is 0 does not lift the whole layer (block error 0) off 0."""
    from nsc_prune.hf.score.probes import _ProbeWalk, scaled_errors

    walk = _ProbeWalk(None, 1)
    walk.measured = [[(1, 0), (2, 1)], [(1, 2), (-1, 3)]]  # layer 1 under a plan: -1 is its whole width
    assert walk.anchor_damage([-0.02, 0.5, 0.1, 0.3]) == [{1: 0.0, 2: 0.5}, {1: 0.0}]
    row = (LayerPlan(ffn=8), LayerPlan(ffn=4), LayerPlan(ffn=0, kv_groups=0, keep=False))
    assert scaled_errors([0.0, 0.0, 1.0], {1: 0.3, 2: 2.0}, row) == [0.0, 0.0, 2.0]

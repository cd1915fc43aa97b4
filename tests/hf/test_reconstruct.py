"""Reconstruction (``extract --reconstruct``): the refit is the least-squares fit it claims to be, extraction writes
the blocks a sequential whole-model refit computes by hand, it brings the pruned model closer to the dense one, a
plan that cuts nothing is written unchanged, and what cannot run is refused in one line."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402
from test_extract_heads_depth import Identity, logits  # noqa: E402
from test_selection import calib_text  # noqa: E402

from nsc_prune.cli import main  # noqa: E402
from nsc_prune.errors import InvalidInputError  # noqa: E402
from nsc_prune.hf.cut.jobs import layer_indexes  # noqa: E402
from nsc_prune.hf.cut.keep import LayerOrder  # noqa: E402
from nsc_prune.hf.cut.reconstruct import MODULES, ReconstructConfig, cut_columns, refit  # noqa: E402
from nsc_prune.hf.cut.selection import SelectionConfig, calibration_tokens  # noqa: E402
from nsc_prune.hf.extract import ExtractOptions, extract_subnet  # noqa: E402
from nsc_prune.hf.weights.base import open_base  # noqa: E402
from nsc_prune.hf.weights.loading import load_pruned  # noqa: E402
from nsc_prune.plan import LayerPlan  # noqa: E402


def _tensors(folder):
    return {name: tensor for path in sorted(folder.glob("*.safetensors")) for name, tensor in load_file(path).items()}


def _correlated_inputs(rng, n=12, tokens=400):
    mix = rng.standard_normal((n, n)) + 2 * np.eye(n)
    return mix @ rng.standard_normal((n, tokens))  # (n, tokens): correlated channels


def test_refit_at_ridge_zero_is_the_least_squares_fit():
    rng = np.random.default_rng(0)
    x, weight = _correlated_inputs(rng), rng.standard_normal((5, 12))
    kept = [0, 2, 3, 7, 8, 11]
    got = refit(torch.from_numpy(weight), torch.from_numpy(x @ x.T), kept, 0.0).numpy()
    # min_W' ||W X - W' X_K||: lstsq of X_K^T W'^T = (W X)^T
    expected = np.linalg.lstsq(x[kept].T, (weight @ x).T, rcond=None)[0].T
    np.testing.assert_allclose(got, expected, rtol=1e-8, atol=1e-10)
    cut_error = np.linalg.norm(weight @ x - weight[:, kept] @ x[kept])
    assert np.linalg.norm(weight @ x - got @ x[kept]) < 0.9 * cut_error


def test_refit_exact_where_cut_channels_are_kept_ones_combined_and_plain_cut_at_large_ridge():
    rng = np.random.default_rng(1)
    kept_x = rng.standard_normal((6, 300))
    x = np.concatenate([kept_x, rng.standard_normal((3, 6)) @ kept_x])  # channels 6-8 are combinations of 0-5
    weight = rng.standard_normal((4, 9))
    gram, w = torch.from_numpy(x @ x.T), torch.from_numpy(weight)
    exact = refit(w, gram, list(range(6)), 0.0).numpy()
    np.testing.assert_allclose(exact @ kept_x, weight @ x, atol=1e-8)
    assert torch.equal(refit(w, gram, list(range(9)), 1.0), w)  # nothing cut: the weight itself
    np.testing.assert_allclose(refit(w, gram, [0, 1, 2], 1e12).numpy(), weight[:, :3], atol=1e-9)
    ridge = refit(w, gram, list(range(6)), 1.0).numpy()
    g_kk, g_kp = x[:6] @ x[:6].T, x[:6] @ x[6:].T  # the ridge is relative: lambda = ridge x mean(diag G_KK)
    damped = weight[:, :6] + weight[:, 6:] @ np.linalg.solve(g_kk + np.trace(g_kk) / 6 * np.eye(6), g_kp).T
    np.testing.assert_allclose(ridge, damped, rtol=1e-9, atol=1e-12)
    assert not np.allclose(ridge, exact) and not np.allclose(ridge, weight[:, :6])
    silent = torch.zeros(9, 9)  # no channel ever fires (a layer a padded checkpoint dropped): G_KK + damping was
    silent[8, 8] = 1.0  # singular, a LinAlgError; the refit is then the plain cut
    assert torch.equal(refit(w, silent.double(), [0, 1, 2], 1.0), w[:, :3])
    silent[0, 0] = float("nan")  # an overflowed Gram: refused in one line, not a LinAlgError
    with pytest.raises(InvalidInputError, match="the reconstruction refit is not finite"):
        refit(w, silent.double(), [0, 1, 2], 1.0)


def _hand_refit(tiny, plans, orders, ids, seq_len, ridge):
    """Sequential refit on the whole float32 model: layer by layer, the Gram matrices of the cut matrices' inputs on
    the model whose earlier layers are already pruned and refit, then the layer pruned (cut columns zeroed)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny.base, dtype=torch.float32).eval()
    base = open_base(tiny.base)
    indexes = layer_indexes(plans, base, orders)
    chunks = [ids[s : s + seq_len][None] for s in range(0, len(ids), seq_len)]
    blocks = {}
    for i, index in enumerate(indexes):
        if index is None:
            model.model.layers[i] = Identity()
            continue
        layer = model.model.layers[i]
        cuts = {m: c for m in MODULES if (c := cut_columns(m, index)) is not None}
        grams = {
            m: torch.zeros(layer.get_submodule(m).in_features, layer.get_submodule(m).in_features, dtype=torch.float64)
            for m in cuts
        }

        def hook(module, args, m):
            x = args[0].flatten(0, -2).double()
            grams[m] += x.T @ x

        handles = [layer.get_submodule(m).register_forward_pre_hook(lambda mod, a, m=m: hook(mod, a, m)) for m in cuts]
        with torch.no_grad():
            for chunk in chunks:
                model(chunk, use_cache=False)
        for handle in handles:
            handle.remove()
        with torch.no_grad():
            for m, kept in cuts.items():
                weight = layer.get_submodule(m).weight
                blocks[(i, m)] = refit(weight, grams[m], kept, ridge).float()
                weight.zero_()
                weight[:, kept] = blocks[(i, m)]
    return blocks, model


@pytest.mark.parametrize("ridge", [0.0, 1.0])
def test_extraction_writes_the_sequential_refit_and_is_closer_to_the_dense_model(
    tmp_path, tiny_llama, write_plan, ridge
):
    tiny = tiny_llama(gqa=True, lora=False)
    layers = [{"ffn": 40, "kv_groups": 1}, {"ffn": 0, "kv_groups": 0, "keep": False}, {"ffn": 56, "kv_groups": 2}]
    pareto = write_plan(tmp_path / "pareto.json", layers, tiny.config)
    selection = SelectionConfig(
        "activation", calib=str(calib_text(tmp_path / "c.txt", words=900)), calib_tokens=1024, seq_len=128
    )
    out = extract_subnet(
        pareto,
        tiny.base,
        tmp_path / "ls",
        point=0,
        selection=selection,
        options=ExtractOptions(dtype="float32"),
        reconstruct=ReconstructConfig(ridge),
    )
    plain = extract_subnet(
        pareto, tiny.base, tmp_path / "cut", point=0, selection=selection, options=ExtractOptions(dtype="float32")
    )
    record = json.loads((out / "nsc_prune_extract.json").read_text())["reconstruction"]
    assert record["ridge"] == ridge and record["calib_tokens"] == 1024
    assert record["matrices"] == ["0.mlp.down_proj", "0.self_attn.o_proj", "2.mlp.down_proj"]

    base = open_base(tiny.base)
    ids, _ = calibration_tokens(base, selection)
    from nsc_prune.hf.cut.selection import channel_orders

    orders, _ = channel_orders(base, selection)
    plans = [LayerPlan(**layer) for layer in layers]
    expected, hand_model = _hand_refit(tiny, plans, orders, ids, 128, ridge)
    written = _tensors(out)
    for (i, module), block in expected.items():
        name = f"model.layers.{0 if i == 0 else 1}.{module}.weight"  # layer 1 is dropped: 2 -> 1
        torch.testing.assert_close(written[name], block, rtol=1e-4, atol=1e-6)
    untouched = _tensors(plain)
    for name in ("model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.o_proj.weight"):
        assert torch.equal(written[name], untouched[name])  # nothing else changes

    chunk = ids[:128][None]
    refit_logits = logits(load_pruned(out), chunk)
    torch.testing.assert_close(refit_logits, logits(hand_model, chunk), rtol=1e-4, atol=1e-4)
    dense = logits(transformers.AutoModelForCausalLM.from_pretrained(tiny.base, dtype=torch.float32).eval(), chunk)
    error = (refit_logits - dense).pow(2).mean()
    assert error < 0.9 * (logits(load_pruned(plain), chunk) - dense).pow(2).mean()


def test_a_plan_that_cuts_nothing_is_written_unchanged(tmp_path, tiny_llama, write_plan):
    tiny = tiny_llama(gqa=True, lora=False)
    layers = [{"ffn": 96, "kv_groups": 2}, {"ffn": 0, "kv_groups": 0, "keep": False}, {"ffn": 96, "kv_groups": 2}]
    pareto = write_plan(tmp_path / "pareto.json", layers, tiny.config)
    selection = SelectionConfig("activation", calib=str(calib_text(tmp_path / "c.txt")))
    kwargs = {"point": 0, "selection": selection, "options": ExtractOptions(dtype="float32")}
    out = extract_subnet(pareto, tiny.base, tmp_path / "ls", reconstruct=ReconstructConfig(), **kwargs)
    plain = extract_subnet(pareto, tiny.base, tmp_path / "cut", **kwargs)
    assert json.loads((out / "nsc_prune_extract.json").read_text())["reconstruction"]["matrices"] == []
    written, expected = _tensors(out), _tensors(plain)
    assert written.keys() == expected.keys() and all(torch.equal(written[k], expected[k]) for k in written)


def test_an_order_that_keeps_other_channels_changes_the_refit(tmp_path, tiny_llama):
    """The refit follows the selection's kept columns (not the first ones)."""
    tiny = tiny_llama(gqa=False, lora=False)
    base = open_base(tiny.base)
    plans = [LayerPlan(ffn=48, kv_groups=4)] * 3
    rng = random.Random(0)
    shuffled = [LayerOrder(tuple(rng.sample(range(96), 96)), tuple(range(4))) for _ in range(3)]
    ids = torch.randint(3, 128, (256,), generator=torch.Generator().manual_seed(0))
    from nsc_prune.hf.cut.reconstruct import reconstructed_blocks

    first = reconstructed_blocks(layer_indexes(plans, base, None), base, ids, 128, ReconstructConfig(), bar=None)
    other = reconstructed_blocks(layer_indexes(plans, base, shuffled), base, ids, 128, ReconstructConfig(), bar=None)
    assert sorted(first) == [(i, "mlp.down_proj") for i in range(3)]
    expected, _ = _hand_refit(tiny, plans, shuffled, ids, 128, 1.0)
    torch.testing.assert_close(other[(0, "mlp.down_proj")], expected[(0, "mlp.down_proj")], rtol=1e-4, atol=1e-6)
    assert not torch.allclose(first[(0, "mlp.down_proj")], other[(0, "mlp.down_proj")])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--reconstruct"], "--reconstruct fits the cut weights on calibration text: pass --calib FILE"),
        (["--reconstruct", "--selection", "magnitude"], "not --selection magnitude"),
        (  # asked for the --calib it was given
            ["--reconstruct", "--selection", "first", "--calib", "C"],
            "pass --calib FILE with --selection activation (what --calib selects by default), not --selection first",
        ),
        (
            ["--reconstruct", "--calib", "C", "--reconstruct-ridge", "-1"],
            "--reconstruct-ridge must be a number in [0, 1e+12]",
        ),
        (
            ["--reconstruct", "--calib", "C", "--reconstruct-ridge", "nan"],
            "--reconstruct-ridge must be a number in [0, 1e+12]",
        ),
        (["--calib", "C", "--reconstruct-ridge", "0.5"], "--reconstruct-ridge without --reconstruct"),
        (["--reconstruct", "--adapter", "A", "--selection", "activation", "--calib", "C"], "drop --adapter"),
    ],
)
def test_what_cannot_reconstruct_is_refused_in_one_line(tmp_path, tiny_llama, write_plan, capsys, flags, message):
    tiny = tiny_llama(lora=True)
    pareto = write_plan(tmp_path / "pareto.json", [{"ffn": 50}] * 3, tiny.config)
    calib = str(calib_text(tmp_path / "c.txt"))
    flags = [{"C": calib, "A": str(tiny.adapter)}.get(flag, flag) for flag in flags]
    argv = ["extract", "--pareto", str(pareto), "--point", "0", "--base", str(tiny.base), "--out", str(tmp_path / "o")]
    capsys.readouterr()
    assert main([*argv, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


def test_config_refuses_bad_ridges():
    for bad in (-0.1, float("inf"), True, "1", 1e308):  # 1e308 overflowed to NaN weights, and exit 0
        with pytest.raises(InvalidInputError, match=r"--reconstruct-ridge must be a number in \[0, 1e\+12\]"):
            ReconstructConfig(bad)
    assert ReconstructConfig(1e12).ridge == 1e12


def test_cli_reconstructs_and_the_padded_format_holds_the_same_model(tmp_path, tiny_llama, write_plan, capsys):
    tiny = tiny_llama(gqa=True, lora=False)
    layers = [{"ffn": 40, "kv_groups": 1}, {"ffn": 72, "kv_groups": 2}, {"ffn": 96, "kv_groups": 1}]
    pareto = write_plan(tmp_path / "pareto.json", layers, tiny.config)
    argv = [
        "extract",
        "--pareto",
        str(pareto),
        "--point",
        "0",
        "--base",
        str(tiny.base),
        "--dtype",
        "float32",
        "--calib",
        str(calib_text(tmp_path / "c.txt")),
        "--reconstruct",
        "--reconstruct-ridge",
        "0.5",
        "--quiet",
    ]
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "pruned")]) == 0
    assert "selection activation, reconstructed (ridge 0.5)" in capsys.readouterr().out
    assert main([*argv, "--format", "padded", "--out", str(tmp_path / "padded")]) == 0
    record = json.loads((tmp_path / "padded" / "nsc_prune_extract.json").read_text())["reconstruction"]
    assert record["matrices"] == ["0.mlp.down_proj", "0.self_attn.o_proj", "1.mlp.down_proj", "2.self_attn.o_proj"]
    card = (tmp_path / "padded" / "README.md").read_text()
    assert "(4) were refit by ridge least squares (ridge 0.5)" in card and '"reconstruction"' in card
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    padded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "padded", dtype=torch.float32).eval()
    torch.testing.assert_close(logits(padded, ids), logits(load_pruned(tmp_path / "pruned"), ids), rtol=0, atol=1e-5)


def test_library_refuses_reconstruction_without_calibration_or_with_an_adapter(tmp_path, tiny_llama, write_plan):
    from nsc_prune.errors import ConfigError

    tiny = tiny_llama(lora=True)
    pareto = write_plan(tmp_path / "pareto.json", [{"ffn": 50}] * 3, tiny.config)
    with pytest.raises(
        ConfigError, match="pass --calib FILE with --selection activation .*, not --selection magnitude"
    ):
        extract_subnet(
            pareto,
            tiny.base,
            tmp_path / "o",
            point=0,
            selection=SelectionConfig("magnitude"),
            reconstruct=ReconstructConfig(),
        )
    with pytest.raises(ConfigError, match="drop --adapter"):
        extract_subnet(
            pareto, tiny.base, tmp_path / "o", point=0, adapter=tiny.adapter, reconstruct=ReconstructConfig()
        )
    assert not (tmp_path / "o").exists()

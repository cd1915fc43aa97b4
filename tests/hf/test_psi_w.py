"""psi_W back-end: prefix log-dets equal SVDs of truncated weights; the search and report run."""

import json

import pytest

torch = pytest.importorskip("torch")

from nsc_prune.core.capacity import psi_weights  # noqa: E402
from nsc_prune.core.front import search  # noqa: E402
from nsc_prune.errors import ConfigError, InvalidInputError, UnsupportedArchitectureError  # noqa: E402
from nsc_prune.hf.score.psi_w import consistency_report, prefix_psi, weight_values  # noqa: E402
from nsc_prune.spaces.registry import build_space  # noqa: E402
from tests.conftest import spoil_weight  # noqa: E402


def test_prefix_psi_equals_svd_of_every_truncation():
    w = torch.randn(40, 25, dtype=torch.float64) * 0.3
    rows, cols = prefix_psi(w, 0), prefix_psi(w, 1)
    assert rows[0] == 0.0 and cols[0] == 0.0
    for k in (1, 7, 25, 40):
        assert rows[k] == pytest.approx(psi_weights(w[:k].numpy()), rel=1e-10)
    for k in (1, 13, 25):
        assert cols[k] == pytest.approx(psi_weights(w[:, :k].numpy()), rel=1e-10)


def test_weight_values_equal_direct_svd_and_cache(tiny_llama, tmp_path):
    tiny = tiny_llama(gqa=True, lora=False, layers=2, hidden=32, heads=4, ffn=48)
    space = build_space("ffn-heads", tiny.config, ffn_step=16, ffn_min_fraction=0.25)
    values = weight_values(space, tiny.base, tiny.config, cache_dir=tmp_path / "cache")
    from safetensors.torch import load_file

    state = {}
    for shard in sorted(tiny.base.glob("*.safetensors")):
        state.update(load_file(shard))
    hd, group = 8, 2
    for layer, options in enumerate(space.subspaces[0].layers):
        get = lambda name: state[f"model.layers.{layer}.{name}.weight"].double()  # noqa: E731
        for option, value in zip(options, values[0][layer]):
            kv, k = option.label["kv_groups"], option.label["ffn"]
            heads = kv * group
            expected = sum(psi_weights(get("self_attn.q_proj")[h * hd : (h + 1) * hd].numpy()) for h in range(heads))
            expected += psi_weights(get("self_attn.o_proj")[:, : heads * hd].numpy())  # one matrix, as psi_MP's
            expected += sum(
                psi_weights(get(f"self_attn.{m}")[g * hd : (g + 1) * hd].numpy())
                for m in ("k_proj", "v_proj")
                for g in range(kv)
            )
            expected += psi_weights(get("mlp.gate_proj")[:k].numpy()) + psi_weights(get("mlp.up_proj")[:k].numpy())
            expected += psi_weights(get("mlp.down_proj")[:, :k].numpy())
            assert value == pytest.approx(expected, rel=1e-9)
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2 * 7  # one entry per tensor, reused next time
    again = weight_values(space, tiny.base, tiny.config, cache_dir=tmp_path / "cache")
    assert again == values
    entries = sorted((tmp_path / "cache").glob("*.json"))
    entries[0].write_text(entries[0].read_text()[:5])  # truncated
    entries[1].write_text("[1.0, 2.0]")  # too few values: a broadcast error deep in the sum
    entries[2].write_text("[NaN]")
    with pytest.warns(UserWarning, match="psi_W cache entry .* is unreadable.*computing it again"):
        assert weight_values(space, tiny.base, tiny.config, cache_dir=tmp_path / "cache") == values
    entries[0].unlink()
    entries[0].mkdir()
    with pytest.raises(InvalidInputError, match="the cache entry .* is a folder where nsc-prune keeps a file"):
        weight_values(space, tiny.base, tiny.config, cache_dir=tmp_path / "cache")

    mp = search(space)
    svd = search(space, values=values)
    report = consistency_report(mp, svd, values[0])
    assert report["points"] == len(mp.points) and -1 <= report["kendall_tau"] <= 1
    assert 0 <= report["regret_mean"] <= report["regret_max"]  # the psi_W DP is the psi_W oracle


def test_histogram_match_compares_each_axis_by_value():
    """Appendix G.2: the multisets of FFN widths and of KV groups agree, whatever layer holds which. The option
    indices it compared meant other widths in layers with other tables (a pruned checkpoint's), and tied the two
    axes together."""
    from types import SimpleNamespace

    from nsc_prune.core.layer_plan import LayerPlan

    def front(*points):
        return SimpleNamespace(points=points, cost_of=lambda point: 0, index_under=lambda budget: 0)

    def point(*layers, options):
        return SimpleNamespace(
            layers=tuple(LayerPlan(ffn=f, kv_groups=kv) for f, kv in layers), options=options, nsc=1.0
        )

    def match(chosen, oracle) -> float:
        return consistency_report(front(chosen), front(oracle), [[1.0] * 4] * 2)["histogram_match"]

    # the same widths and groups, held by other layers: a match (the indices differ)
    assert match(point((64, 2), (32, 1), options=(2, 1)), point((64, 1), (32, 2), options=(3, 0))) == 1.0
    # the same indices, of tables that differ by layer (layer 0: 64, 32; layer 1: 48, 16): other widths
    assert match(point((64, 2), (16, 2), options=(0, 1)), point((32, 2), (48, 2), options=(1, 0))) == 0.0


def test_a_pruned_checkpoint_is_scored_with_each_layers_own_heads(tiny_llama, tmp_path, write_plan):
    """psi_W read every layer with the global head counts: a checkpoint whose layer 1 kept one KV group failed with a
    reshape error. Its whole layer is the base's cut with the same (first) channels."""
    from nsc_prune.hf.extract import ExtractOptions, extract_subnet

    tiny = tiny_llama(gqa=True, lora=False, layers=2, hidden=32, heads=4, ffn=48)
    layers = [{"ffn": 48, "kv_groups": 2}, {"ffn": 32, "kv_groups": 1}]
    pruned = extract_subnet(write_plan(tmp_path / "p.json", layers, tiny.config), tiny.base, tmp_path / "pruned",
                            point=0, options=ExtractOptions(dtype="float32"))  # fmt: skip
    config = json.loads((pruned / "config.json").read_text())
    space = build_space("ffn-heads", config, ffn_step=16, ffn_min_fraction=0.25)
    values = weight_values(space, pruned, config, cache_dir=tmp_path / "cache")
    base_space = build_space("ffn-heads", tiny.config, ffn_step=16, ffn_min_fraction=0.25)
    base = weight_values(base_space, tiny.base, tiny.config, cache_dir=tmp_path / "cache")
    cut = [(o.label["ffn"], o.label["kv_groups"]) for o in base_space.subspaces[0].layers[1]].index((32, 1))
    assert values[0][1][0] == pytest.approx(base[0][1][cut], rel=1e-9)


def test_the_cache_tells_apart_tensors_of_the_same_bytes(tmp_path):
    """The key was the bytes alone: the same bytes as another dtype or shape read the first tensor's values."""
    import torch
    from safetensors.torch import save_file

    from nsc_prune.hf.score.psi_w import _CachedReader

    weights = torch.randn(12, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    folders = {}
    for name, tensor in {"a": weights, "b": weights.view(torch.float16), "c": weights.reshape(8, 12)}.items():
        folders[name] = tmp_path / name
        folders[name].mkdir()
        save_file({"model.layers.0.mlp.up_proj.weight": tensor}, folders[name] / "model.safetensors")
    config = {"model_type": "llama", "num_hidden_layers": 1}
    found = {}
    for name, folder in folders.items():
        reader = _CachedReader(folder, tmp_path / "cache")
        found[name] = reader.compute(config, 0, "mlp.up_proj", "prefix-rows", lambda t: prefix_psi(t, 0, "cpu"))
        reader.reader.close()
    for name in ("b", "c"):
        fresh = _CachedReader(folders[name], tmp_path / f"fresh-{name}")
        expected = fresh.compute(config, 0, "mlp.up_proj", "prefix-rows", lambda t: prefix_psi(t, 0, "cpu"))
        fresh.reader.close()
        assert len(found[name]) == len(expected) and found[name] == pytest.approx(expected)


def test_cache_entries_written_by_earlier_versions_are_still_found(tmp_path):
    """The key is sha256(sha256(dtype and shape) + the tensor's bytes), as version 2 entries were named: a cache
    built before stays valid (a 70B model's psi_W takes hours to build again)."""
    import hashlib

    import torch
    from safetensors.torch import save_file

    from nsc_prune.hf.score.psi_w import CACHE_VERSION, _CachedReader

    tensor = torch.randn(12, 8, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    save_file({"model.layers.0.mlp.up_proj.weight": tensor}, tmp_path / "model.safetensors")
    header = hashlib.sha256(b"BF16(12, 8)").digest()  # the safetensors dtype name and the shape
    key = hashlib.sha256(header + tensor.view(torch.int16).numpy().tobytes()).hexdigest()[:32]
    (tmp_path / "cache").mkdir()
    stored = list(range(13))  # 12 rows: 13 prefix values, none of them psi's
    (tmp_path / "cache" / f"{key}-prefix-rows-v{CACHE_VERSION}.json").write_text(json.dumps(stored))
    reader = _CachedReader(tmp_path, tmp_path / "cache")
    found = reader.compute({"model_type": "llama", "num_hidden_layers": 1}, 0, "mlp.up_proj", "prefix-rows", None)
    reader.reader.close()
    assert found.tolist() == stored


def test_svd_backend_refuses_lora_spaces(tiny_llama, tmp_path):
    tiny = tiny_llama(lora=False, layers=1)
    with pytest.raises(ConfigError, match="supports the elastic spaces"):
        weight_values(build_space("lonas", tiny.config), tiny.base, tiny.config, cache_dir=tmp_path)


def test_weights_of_another_model_are_refused_before_any_compute(tiny_llama, tmp_path, capsys):
    from nsc_prune.cli import main

    model = tiny_llama(gqa=True, lora=False, layers=2, hidden=32, heads=4, ffn=48)
    other = tiny_llama(gqa=True, lora=False, layers=2, hidden=32, heads=4, ffn=64, seed=1)
    space = build_space("ffn-grid", model.config, ffn_step=16)
    with pytest.raises(
        ConfigError, match="config.json has intermediate_size=64 but the model config has intermediate_size=48"
    ):
        weight_values(space, other.base, model.config, cache_dir=tmp_path / "cache")
    (other.base / "config.json").unlink()  # no config: the tensor shapes decide
    with pytest.raises(
        ConfigError, match="mlp.gate_proj.weight is \\[64, 32\\] but the model config implies \\[48, 32\\]"
    ):
        weight_values(space, other.base, model.config, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()  # nothing computed
    deeper = tiny_llama(gqa=True, lora=False, layers=1, hidden=32, heads=4, ffn=48)
    (deeper.base / "config.json").unlink()
    with pytest.raises(ConfigError, match="has no tensor model.layers.1.self_attn.q_proj.weight"):
        weight_values(space, deeper.base, model.config, cache_dir=tmp_path / "cache")

    wrong = tiny_llama(gqa=False, lora=False, layers=2, hidden=32, heads=4, ffn=48, seed=2)
    capsys.readouterr()
    argv = [
        "--model",
        str(model.base),
        "--space",
        "ffn-grid",
        "--set",
        "ffn_step=16",
        "--score",
        "psi_w",
        "--weights",
        str(wrong.base),
        "--budget",
        "90%",
        "--out",
        str(tmp_path / "out"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "num_key_value_heads=4 but the model config has num_key_value_heads=2" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
    argv[argv.index("90%")] = "1%"  # below the front: the weights are named first, as under --score measured
    assert main(argv) == 2
    assert "num_key_value_heads=4 but the model config has num_key_value_heads=2" in capsys.readouterr().err


def test_weights_holding_nan_are_refused_in_one_line(tiny_llama, tmp_path, monkeypatch, capsys):
    from nsc_prune.cli import main

    monkeypatch.setenv("NSC_PRUNE_CACHE", str(tmp_path / "cache"))
    model = tiny_llama(lora=False, layers=2, hidden=32, heads=4, ffn=48)
    spoil_weight(model.base, "model.layers.1.mlp.up_proj.weight")  # was a LinAlgError traceback
    argv = ["--model", str(model.base), "--space", "ffn-grid", "--set", "ffn_step=16", "--score", "psi_w",
            "--weights", str(model.base), "--budget", "90%", "--out", str(tmp_path / "out"), "--quiet"]  # fmt: skip
    capsys.readouterr()  # the fixture's own output
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "tensor model.layers.1.mlp.up_proj.weight holds NaN or inf values" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("score", ["psi_w", "measured"])
def test_weights_that_are_not_a_folder_are_named_by_their_flag(tiny_llama, tmp_path, score, capsys):
    from nsc_prune.cli import main

    model = tiny_llama(lora=False, layers=2, hidden=32, heads=4, ffn=48)
    (tmp_path / "calib.txt").write_text("w3 w4 " * 100)
    shard = next(model.base.glob("*.safetensors"))  # was "Not a directory: ... choose another --out" (psi_w)
    for weights in (shard, tmp_path / "missing"):  # was "No such file or directory" (psi_w), "base must be" (measured)
        argv = ["--model", str(model.base), "--space", "ffn-grid", "--set", "ffn_step=16", "--score", score,
                "--weights", str(weights), "--budget", "90%", "--out", str(tmp_path / "out"), "--quiet"]  # fmt: skip
        capsys.readouterr()
        assert main([*argv, *(["--calib", str(tmp_path / "calib.txt")] if score == "measured" else [])]) == 2
        err = capsys.readouterr().err
        assert f"--weights must be a {'safetensors ' if score == 'psi_w' else ''}model folder" in err, err
        assert f"got '{weights}'" in err and err.count("\n") == 1


def test_the_summary_gives_percentages_of_the_full_model_when_the_score_drops_it(tiny_llama, tmp_path, capsys):
    """FFN channels 32-47 zero in every layer: psi_W ties the full width with 32, so the full model is off the
    front; the summary said "100.0% of" the front's largest point instead of the full model's count (and the
    consistency report's undefined tau was a NaN, a traceback when pareto.json was written)."""
    from safetensors.torch import load_file, save_file

    from nsc_prune.cli import main
    from nsc_prune.core.budget import format_count

    tiny = tiny_llama(lora=False, layers=2, hidden=32, heads=4, ffn=48, max_shard_size="10MB")
    (shard,) = tiny.base.glob("*.safetensors")
    state = load_file(shard)
    for name, tensor in state.items():
        if "gate_proj" in name or "up_proj" in name:
            tensor[32:] = 0
        elif "down_proj" in name:
            tensor[:, 32:] = 0
    save_file(state, shard, metadata={"format": "pt"})
    full = sum(tensor.numel() for tensor in state.values())
    argv = ["--model", tiny.base, "--weights", tiny.base, "--space", "ffn-grid", "--set", "ffn_step=16", "--score",
            "psi_w", "--budget", "100%", "--out", tmp_path / "out", "--quiet", "--no-plot"]  # fmt: skip
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 0
    out = capsys.readouterr().out
    assert "Kendall tau and Spearman rho undefined (one score is constant" in out  # was NaN: pareto.json unwritable
    line = next(line for line in out.splitlines() if line.startswith("params "))
    kept = full - 2 * 16 * 3 * 32  # two layers without 16 channels of three matrices of width 32
    assert f"params {format_count(kept)} ({100 * kept / full:.1f}% of {format_count(full)})" in line, line


def test_olmo2_psi_w_refuses_kv_group_cuts_in_one_line(tmp_path):
    """As under --score measured: OLMo 2's whole-projection q/k norms leave no exact KV-group cut, so psi_W must not
    score one (it would rank plans extraction cannot write), and nothing is computed or cached."""
    from test_extract_model_types import build_tiny

    from nsc_prune.hf.weights.base import open_base

    tiny = build_tiny(tmp_path, "olmo2", lora=False)
    config = open_base(tiny.base).config
    with pytest.raises(UnsupportedArchitectureError, match=r"^--score psi_w of olmo2 cannot cut KV groups: [^\n]*$"):
        weight_values(build_space("ffn-heads", config, ffn_step=32), tiny.base, config, cache_dir=tmp_path / "c")
    assert not (tmp_path / "c").exists()
    weight_values(build_space("ffn-grid", config, ffn_step=32), tiny.base, config, cache_dir=tmp_path / "c")

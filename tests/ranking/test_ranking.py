"""Ranking metrics, benchmark files and ``nsc-prune rank``: the paper's numbers on real data."""

from __future__ import annotations

import itertools
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from nsc_prune.cli import main
from nsc_prune.core.capacity import MIN_INIT_STD, parse_init, psi_mp
from nsc_prune.errors import InvalidInputError
from nsc_prune.ranking import families
from nsc_prune.ranking import metrics as ranking
from nsc_prune.ranking.benchmarks import (
    AUTOFORMER_TINY_FILE,
    BENCHMARKS_ENV,
    benchmarks_dir,
    detect_format,
    load_benchmark,
    missing_benchmark_note,
)
from nsc_prune.ranking.families.autoformer import parse_head_dim

ROOT = Path(__file__).resolve().parents[2]
FLEXIBERT = ROOT / "evals/ranking/flexibert_glue_500.json"
GPT2 = ROOT / "evals/ranking/lts_gpt2_wt103_200.json"
AUTOFORMER = benchmarks_dir() / AUTOFORMER_TINY_FILE
needs_autoformer = pytest.mark.skipif(
    not AUTOFORMER.exists(), reason=f"not redistributable: {missing_benchmark_note(AUTOFORMER)}"
)


def r3(value):
    return round(value, 3)


# ---------------------------------------------------------------------------------------------
# metrics against independent references


def brute_windowed_tau(x, y, z, window):
    num = nx = ny = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        if abs(z[i] - z[j]) < window * max(abs(z[i]), abs(z[j])):
            sx, sy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
            num += sx * sy
            nx += sx != 0
            ny += sy != 0
    return num / np.sqrt(nx * ny)


@pytest.mark.parametrize("seed", range(5))
def test_windowed_tau_matches_pairwise_loop(seed):
    rng = np.random.default_rng(seed)
    n = 60
    z = rng.integers(100, 130, n).astype(float)
    x, y = z + rng.normal(0, 5, n), np.round(z + rng.normal(0, 5, n))  # y has ties
    assert ranking.windowed_tau(x, y, z, 0.1, block=7) == pytest.approx(brute_windowed_tau(x, y, z, 0.1), rel=1e-12)
    assert ranking.windowed_tau(x, y, z, 1.0) == pytest.approx(
        stats.kendalltau(x, y).statistic, rel=1e-12
    )  # every pair


def test_partial_tau_conover_iman():
    rng = np.random.default_rng(0)
    z = rng.normal(size=300)
    x, y = z + rng.normal(size=300), z + rng.normal(size=300)
    assert ranking.kendall_tau(x, y) > 0.3
    assert abs(ranking.partial_tau(x, y, [z])) < 0.08  # related only through z
    # hand-rolled estimator: residualise ranks on [1, rank(z)], tau of residuals
    rz = stats.rankdata(z)
    design = np.column_stack([np.ones(300), rz])
    res = [r - design @ np.linalg.lstsq(design, r, rcond=None)[0] for r in (stats.rankdata(x), stats.rankdata(y))]
    assert ranking.partial_tau(x, y, [z]) == pytest.approx(stats.kendalltau(*res).statistic, rel=1e-12)
    assert ranking.partial_tau(z, y, [z]) is None  # self-control is undefined
    assert ranking.partial_tau(2 * z + 1, y, [z, x]) is None


def test_snap_ties_and_distinct_count():
    a = np.array([1.0, 1.0 + 1e-13, 2.0, 3.0, 3.0 * (1 + 1e-12), 4.0])
    snapped = ranking.snap_ties(a)
    assert snapped[0] == snapped[1] and snapped[3] == snapped[4] and ranking.distinct_count(a) == 4
    assert ranking.distinct_count(np.arange(5.0)) == 5
    # log(0) of an empty layer is -inf: it tied with its finite neighbour (1.0 became -inf; 1.0, inf became 1.0, 1.0)
    assert ranking.snap_ties([-np.inf, 1.0, 2.0]).tolist() == [-np.inf, 1.0, 2.0]
    assert ranking.snap_ties([1.0, np.inf, np.inf, -np.inf]).tolist() == [1.0, np.inf, np.inf, -np.inf]
    assert ranking.distinct_count([-np.inf, -np.inf, 1.0, 1.0 + 1e-13]) == 2
    assert np.isnan(ranking.snap_ties([1.0, np.nan])[1])  # was 1.0
    assert ranking.kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1)
    with pytest.raises(InvalidInputError, match="same length"):
        ranking.kendall_tau([1, 2], [1, 2, 3])
    with pytest.raises(InvalidInputError, match="finite"):
        ranking.spearman_rho([1, np.nan], [1, 2])


def test_each_metric_reads_its_own_inputs():
    """Kendall and Spearman are scipy's (a score whose first and last values are equal is not constant); the
    params window reads the params, the flops window the flops."""
    from scipy import stats

    x, y = [1.0, 2.0, 3.0, 1.0], [1.0, 2.0, 3.0, 4.0]
    assert ranking.kendall_tau(x, y) == pytest.approx(stats.kendalltau(x, y).statistic, rel=1e-12)
    assert ranking.spearman_rho(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, rel=1e-12)
    score, target, params, flops = [1, 2, 3, 4], [1, 3, 2, 4], [1, 1.01, 1.02, 1.03], [1, 2, 4, 8]
    metrics = ranking.method_metrics(score, target, params, flops)
    assert metrics["windowed_tau_params"] == ranking.windowed_tau(score, target, params) == pytest.approx(2 / 3)
    assert metrics["windowed_tau_flops"] == ranking.windowed_tau(score, target, flops) is None  # no pair that near


def test_constant_input_is_undefined_without_scipy_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scipy's ConstantInputWarning must not leak
        assert ranking.kendall_tau([1, 2, 3], [5, 5, 5]) is None
        assert ranking.spearman_rho([4, 4, 4], [1, 2, 3]) is None
        assert ranking.partial_tau([1, 2, 3, 4], [5, 5, 5, 5], [[1, 3, 2, 4]]) is None
        assert ranking.method_metrics([1, 1, 1], [1, 2, 3], [1, 2, 3], [3, 2, 1])["kendall_tau"] is None


def test_partial_tau_controls_must_match():
    with pytest.raises(InvalidInputError, match="control #1 has 2 values for 3 architectures"):
        ranking.partial_tau([1, 2, 3], [1, 3, 2], [[1, 2, 3], [1, 2]])


def test_parse_init():
    assert (parse_init("xavier"), parse_init("kaiming"), parse_init("0.02")) == ("xavier", "kaiming", 0.02)
    for bad, message in (
        ("glorot", "init must be xavier, kaiming or a positive std"),
        ("-1", "positive finite"),
        ("nan", "positive finite"),
    ):
        with pytest.raises(InvalidInputError, match=message):
            parse_init(bad)


def test_benchmarks_dir_follows_flag_then_env(monkeypatch, tmp_path):
    monkeypatch.setenv(BENCHMARKS_ENV, str(tmp_path))
    assert benchmarks_dir() == tmp_path and benchmarks_dir("elsewhere") == Path("elsewhere")
    note = missing_benchmark_note(benchmarks_dir() / AUTOFORMER_TINY_FILE)
    assert f"{tmp_path / AUTOFORMER_TINY_FILE} not found (looked in {tmp_path}: ${BENCHMARKS_ENV})" in note
    monkeypatch.delenv(BENCHMARKS_ENV)
    assert benchmarks_dir() == ROOT.parent / "shared" / "benchmarks"


# ---------------------------------------------------------------------------------------------
# the paper's numbers (Tables 2, 5, 7-9; appendices C, H)


@pytest.fixture(scope="module")
def flexibert_report():
    return ranking.rank_benchmark(load_benchmark(FLEXIBERT))


@pytest.fixture(scope="module")
def gpt2_report():
    return ranking.rank_benchmark(load_benchmark(GPT2))


def test_flexibert_spec_faithful_matches_paper(flexibert_report):
    nsc = flexibert_report["methods"]["nsc"]
    assert flexibert_report["n"] == 500
    assert (r3(nsc["kendall_tau"]), r3(nsc["spearman_rho"]), nsc["distinct_scores"]) == (0.695, 0.884, 297)
    assert r3(nsc["windowed_tau_flops"]) == 0.298  # paper Table 7, NSC | #FLOPs window
    agg = flexibert_report["aggregation"]
    assert (r3(agg["min"]["spearman_rho"]), agg["min"]["distinct_scores"]) == (0.178, 22)
    assert (r3(agg["product"]["spearman_rho"]), agg["product"]["distinct_scores"]) == (0.917, 362)
    # NSC beats both fair baselines
    assert nsc["kendall_tau"] > flexibert_report["methods"]["params"]["kendall_tau"] + 0.1
    assert nsc["kendall_tau"] > flexibert_report["methods"]["flops"]["kendall_tau"] + 0.1


def test_flexibert_trained_structure_ranks_lower(flexibert_report):
    trained = ranking.rank_benchmark(load_benchmark(FLEXIBERT), families.make_options("flexibert", ffn="trained"))
    nsc = trained["methods"]["nsc"]
    assert (r3(nsc["kendall_tau"]), r3(nsc["spearman_rho"])) == (0.636, 0.838)
    assert nsc["kendall_tau"] < flexibert_report["methods"]["nsc"]["kendall_tau"]


@pytest.mark.parametrize("init, expected", [("kaiming", (0.705, 0.892)), (0.02, (0.575, 0.788))])
def test_flexibert_init_robustness(init, expected):
    report = ranking.rank_benchmark(load_benchmark(FLEXIBERT), families.make_options("flexibert", init=init))
    assert (r3(report["methods"]["nsc"]["kendall_tau"]), r3(report["methods"]["nsc"]["spearman_rho"])) == expected


def test_gpt2_matches_paper_and_nonembedding_params_is_as_good(gpt2_report):
    nsc, params = gpt2_report["methods"]["nsc"], gpt2_report["methods"]["params"]
    assert (r3(nsc["kendall_tau"]), r3(nsc["spearman_rho"]), nsc["distinct_scores"]) == (0.849, 0.968, 200)
    partial = ("partial_tau_params", "partial_tau_flops", "partial_tau_params_flops")
    assert tuple(r3(nsc[key]) for key in partial) == (0.128, 0.183, 0.161)  # docs/families.md's table
    assert (r3(nsc["windowed_tau_params"]), r3(nsc["windowed_tau_flops"])) == (0.202, 0.209)
    flops = gpt2_report["methods"]["flops"]
    assert flops["partial_tau_flops"] is None and r3(flops["partial_tau_params"]) == 0.017
    assert (
        abs(nsc["kendall_tau"] - params["kendall_tau"]) < 0.01
        and abs(nsc["spearman_rho"] - params["spearman_rho"]) < 0.01
    )
    agg = gpt2_report["aggregation"]
    assert (r3(agg["min"]["spearman_rho"]), agg["min"]["distinct_scores"]) == (0.813, 195)
    assert (r3(agg["product"]["spearman_rho"]), agg["product"]["distinct_scores"]) == (0.712, 200)
    # summing every 'params' entry double-counts and makes the baseline look much worse
    data = json.loads(GPT2.read_text())
    summed = [sum(v["params"].values()) for v in data.values()]
    assert ranking.kendall_tau(summed, load_benchmark(GPT2).target) < params["kendall_tau"] - 0.15


@pytest.mark.parametrize("init, expected", [("xavier", (0.814, 0.950)), ("kaiming", (0.798, 0.941))])
def test_gpt2_init_robustness(init, expected):
    report = ranking.rank_benchmark(load_benchmark(GPT2), families.make_options("gpt2", init=init))
    assert (r3(report["methods"]["nsc"]["kendall_tau"]), r3(report["methods"]["nsc"]["spearman_rho"])) == expected


@needs_autoformer
def test_autoformer_tiny_matches_paper():
    report = ranking.rank_benchmark(load_benchmark(AUTOFORMER))
    nsc, params, flops = (report["methods"][k] for k in ("nsc", "params", "flops"))
    assert report["n"] == 1001
    assert (r3(nsc["kendall_tau"]), r3(nsc["spearman_rho"]), nsc["distinct_scores"]) == (0.612, 0.810, 208)
    assert (r3(nsc["windowed_tau_params"]), r3(nsc["windowed_tau_flops"])) == (0.505, 0.495)  # paper 0.503 / 0.494
    assert (r3(params["kendall_tau"]), r3(flops["kendall_tau"])) == (0.469, 0.512)  # paper 0.466 / 0.512
    agg = report["aggregation"]
    assert (r3(agg["min"]["spearman_rho"]), agg["min"]["distinct_scores"]) == (-0.173, 3)
    assert (r3(agg["product"]["spearman_rho"]), agg["product"]["distinct_scores"]) == (0.816, 458)


# ---------------------------------------------------------------------------------------------
# benchmark files: detection and bad input


def nats_file(tmp_path, archs):
    """A generic-format file of NATS-Bench architectures scored by 'acc', higher is better."""
    doc = {"format": "nsc-ranking", "higher_is_better": True, "family": "nats-sss", "target": "acc"}
    return write(tmp_path, {**doc, "architectures": archs})


def write(tmp_path, data, name="bench.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_format_detection():
    assert detect_format(json.loads(FLEXIBERT.read_text())) == "flexibert-glue"
    assert detect_format(json.loads(GPT2.read_text())) == "lts-gpt2"
    assert detect_format({"0": {"net_setting": {}, "performance": {}}}) == "autoformer-ood"
    assert detect_format({"format": "nsc-ranking"}) == "nsc-ranking"
    with pytest.raises(InvalidInputError, match="unrecognised benchmark format; expected one of: flexibert-glue"):
        detect_format({"a": {"b": 1}})
    with pytest.raises(InvalidInputError, match="holds no architectures"):
        detect_format([])


def test_malformed_rows_are_named(tmp_path):
    data = json.loads(GPT2.read_text())
    key = list(data)[3]
    del data[key]["config"]["d_inner"]
    with pytest.raises(InvalidInputError, match=f"architecture '{key}': missing GPT-2 field 'd_inner'"):
        ranking.rank_benchmark(load_benchmark(write(tmp_path, data)))
    data = json.loads(GPT2.read_text())  # a head size the matrices do not have was scored as d_model / n_head
    config = data[key]["config"]
    heads = config["n_head"] if isinstance(config["n_head"], list) else [config["n_head"]] * config["n_layer"]
    config["d_head"] = [2 * config["d_model"] // h for h in heads]
    with pytest.raises(InvalidInputError, match=f"architecture '{key}': layer 0's d_head .* is not d_model / n_head"):
        ranking.rank_benchmark(load_benchmark(write(tmp_path, data)))
    config["d_head"] = [float(config["d_model"] // h) for h in heads]  # what the scores assume: accepted
    ranking.rank_benchmark(load_benchmark(write(tmp_path, data)))
    data[key] = None
    with pytest.raises(
        InvalidInputError, match=f"row '{key}' is malformed \\(a NoneType, not an object\\); expected a JSON"
    ):
        load_benchmark(write(tmp_path, data))  # was "missing or malformed 'NoneType' object is not subscriptable"
    data = json.loads(GPT2.read_text())
    data[key]["config"] = None
    with pytest.raises(InvalidInputError, match=f"'{key}': a GPT-2 config must be a JSON object; got None"):
        ranking.rank_benchmark(load_benchmark(write(tmp_path, data)))
    data[key]["config"] = "x"
    with pytest.raises(InvalidInputError, match=f"'{key}': a GPT-2 config must be a JSON object; got 'x'"):
        ranking.rank_benchmark(load_benchmark(write(tmp_path, data)))
    data = json.loads(GPT2.read_text())
    data[key]["valid_ppl"] = "n/a"
    with pytest.raises(InvalidInputError, match=f"target 'valid_ppl' of row '{key}' must be a finite number"):
        load_benchmark(write(tmp_path, data))
    data[key]["valid_ppl"] = -30.5  # was accepted, and ranked as the best perplexity of all
    with pytest.raises(InvalidInputError, match=f"target 'valid_ppl' of row '{key}' must be at least 1; got -30.5"):
        load_benchmark(write(tmp_path, data))
    rows = json.loads(FLEXIBERT.read_text())[:3]
    del rows[1]["hparams"]["model_hparam_overrides"]
    message = r"\(flexibert-glue format\): row '\d+' lacks 'model_hparam_overrides'; expected"
    with pytest.raises(InvalidInputError, match=message):
        load_benchmark(write(tmp_path, rows))
    rows = json.loads(FLEXIBERT.read_text())[:3]
    rows[2]["hparams"]["model_hparam_overrides"]["nas_config"]["encoder_layers"][0]["num_operation_heads"] = 3
    with pytest.raises(
        InvalidInputError, match=f"architecture '{rows[2]['id']}', layer 0: num_operation_heads=3 does not divide"
    ):
        ranking.rank_benchmark(load_benchmark(write(tmp_path, rows)))


def test_file_level_errors(tmp_path):
    with pytest.raises(InvalidInputError, match="does not exist"):
        load_benchmark(tmp_path / "missing.json")
    with pytest.raises(InvalidInputError, match="is not valid JSON"):
        load_benchmark(write(tmp_path, "{not json"))
    with pytest.raises(InvalidInputError, match="unknown target 'bleu'; choose one of valid_ppl, test_ppl"):
        load_benchmark(GPT2, target="bleu")
    with pytest.raises(InvalidInputError, match="this file holds 'gpt2' architectures; got --family 'flexibert'"):
        load_benchmark(GPT2, family="flexibert")
    with pytest.raises(InvalidInputError, match="unknown family 'gtp2'"):
        load_benchmark(GPT2, family="gtp2")
    assert load_benchmark(GPT2, target="test_ppl").higher_is_better is False


def test_constant_target_is_refused(tmp_path):
    archs = [{"id": c, "config": c, "target": 50.0} for c in ("8:8:8:8:8", "16:16:16:16:16", "64:64:64:64:64")]
    path = nats_file(tmp_path, archs)
    with pytest.raises(InvalidInputError, match="target 'acc' is the same for all 3 architectures"):
        ranking.rank_benchmark(load_benchmark(path))


def test_generic_format_any_family(tmp_path):
    archs = [
        {"id": c, "config": c, "target": t}
        for c, t in (("8:8:8:8:8", 50.0), ("16:16:16:16:16", 60.0), ("64:64:64:64:64", 70.0), ("32:32:32:32:32", 65.0))
    ]
    path = write(
        tmp_path,
        {
            "format": "nsc-ranking",
            "family": "nats-sss",
            "target": "acc",
            "higher_is_better": True,
            "architectures": archs,
        },
    )
    report = ranking.rank_benchmark(load_benchmark(path))
    assert report["n"] == 4 and report["methods"]["nsc"]["kendall_tau"] == pytest.approx(1.0)
    dup = write(
        tmp_path,
        {"format": "nsc-ranking", "higher_is_better": True, "family": "nats-sss", "architectures": archs + archs[:1]},
        "dup.json",
    )
    with pytest.raises(InvalidInputError, match="appears more than once"):
        load_benchmark(dup)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"family": 3}, r"'family' must be a non-empty string; got 3$"),  # was a TypeError from difflib
        ({"family": None}, r"'family' must be a non-empty string; got None$"),
        ({"target": {"x": 1}}, r"'target' must be a non-empty string; got \{'x': 1\}$"),  # was ranked as "{'x': 1}"
        ({"higher_is_better": "false"}, r"'higher_is_better' must be true or false; got 'false'$"),  # bool(): True
        ({"higher_is_better": None}, r"'higher_is_better' must be true or false; got None$"),
        ({"higher_is_better": "drop"}, r"nsc-ranking file is missing 'higher_is_better'$"),  # was: higher is better
        ({"architectures": [{"id": [1], "config": "8:8:8:8:8", "target": 1.0}]}, r"#0: 'id' must be a string or"),
    ],
)
def test_generic_format_refuses_fields_of_the_wrong_type(tmp_path, change, message):
    archs = [{"id": c, "config": c, "target": t} for c, t in (("8:8:8:8:8", 50.0), ("16:16:16:16:16", 60.0))]
    doc = {"format": "nsc-ranking", "higher_is_better": True, "family": "nats-sss", "architectures": archs, **change}
    path = write(tmp_path, {key: value for key, value in doc.items() if value != "drop"})
    with pytest.raises(InvalidInputError, match=message):
        load_benchmark(path)


def test_one_architecture_is_too_few_to_rank(tmp_path):
    archs = [{"id": "a", "config": "8:8:8:8:8", "target": 50.0}, {"id": "b", "config": "16:16:16:16:16"}]
    path = nats_file(tmp_path, archs)
    with pytest.raises(InvalidInputError, match="a ranking needs at least 2 architectures with target 'acc'; got 1"):
        ranking.rank_benchmark(load_benchmark(path))  # was "the same for all 1 architectures"


def test_an_empty_target_is_refused_not_the_default():
    with pytest.raises(InvalidInputError, match="unknown target ''; choose one of valid_ppl"):
        load_benchmark(GPT2, target="")


# ---------------------------------------------------------------------------------------------
# CLI


def test_rank_cli_json_schema(capsys):
    assert main(["rank", "--benchmark", str(GPT2), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n"] == 200 and set(report["methods"]) == {"nsc", "params", "flops"}
    keys = {
        "kendall_tau",
        "spearman_rho",
        "windowed_tau_params",
        "windowed_tau_flops",
        "partial_tau_params",
        "partial_tau_flops",
        "partial_tau_params_flops",
        "distinct_scores",
    }
    assert all(set(m) == keys for m in report["methods"].values())
    assert report["methods"]["params"]["partial_tau_params"] is None
    assert set(report["aggregation"]) == {"sum", "min", "product"}
    assert report["benchmark"]["format"] == "lts-gpt2" and report["options"]["attention"] == "per_head"


def test_a_benchmark_with_nan_where_no_target_is_read_ranks(tmp_path):
    """Python's json writes NaN: a benchmark of another tool with one NaN column was refused whole."""
    data = json.loads(GPT2.read_text())
    first = next(iter(data))
    data[first]["test_ppl"] = float("nan")
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(data))
    assert ranking.rank_benchmark(load_benchmark(path))["n"] == len(data)  # the default target, valid_ppl
    with pytest.raises(InvalidInputError, match=f"target 'test_ppl' of row '{first}' must be a finite number; got nan"):
        load_benchmark(path, target="test_ppl")


def test_a_benchmark_scored_with_another_familys_options_is_refused():
    """A dict or another family's options failed with an AttributeError deep in the family's build."""
    bench = load_benchmark(GPT2)
    assert bench.path == str(GPT2.resolve())  # recorded absolute, as every other record's paths
    for wrong in ({"init": 0.02}, families.make_options("autoformer")):
        with pytest.raises(InvalidInputError, match="options for family 'gpt2' must be its GPT2Options"):
            ranking.rank_benchmark(bench, wrong)


def test_rank_cli_text_and_options(tmp_path, capsys):
    out_file = tmp_path / "report.json"
    assert (
        main(
            ["rank", "--benchmark", str(FLEXIBERT), "--family", "flexibert", "--ffn", "trained", "--out", str(out_file)]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "flexibert-glue (flexibert): 500 architectures vs glue" in text and "aggregation ablation" in text
    assert "tau|P<10%" in text and "tau|F<10%" in text
    assert all(f"\n{rule} " in text for rule in ("sum", "min", "product"))
    assert main(["rank", "--benchmark", str(GPT2), "--window", "0.2", "--init", "0.02"]) == 0
    text = capsys.readouterr().out
    assert "tau|P<20%" in text and "tau|F<20%" in text and "10%" not in text
    saved = json.loads(out_file.read_text())
    assert saved["options"]["ffn"] == "trained" and saved["provenance"]["nsc_prune_version"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--benchmark", "nope.json"], "does not exist"),
        (["--benchmark", str(ROOT / "evals")], "evals is a folder, not a file"),
        (["--benchmark", str(GPT2), "--ffn", "trained"], "family 'gpt2' has no option(s) ['ffn']"),
        (
            ["--benchmark", str(GPT2), "--init", "glorot"],
            "init must be xavier, kaiming or a positive std such as 0.02; got 'glorot'",
        ),
        (
            ["--benchmark", str(GPT2), "--window", "0"],
            "--window must be a fraction in (0, 1), e.g. 0.1 for 10 %; got 0",
        ),
        (
            ["--benchmark", str(GPT2), "--window", "-3"],
            "--window must be a fraction in (0, 1), e.g. 0.1 for 10 %; got -3\n",
        ),
        (
            ["--benchmark", str(GPT2), "--window", "nan"],
            "--window must be a fraction in (0, 1), e.g. 0.1 for 10 %; got nan",
        ),
        (
            ["--benchmark", str(GPT2), "--window", "1"],  # every pair: the plain tau, silently
            "--window must be a fraction in (0, 1)",
        ),
        (
            ["--benchmark", str(GPT2), "--window", "10"],
            "--window must be a fraction in (0, 1)",
        ),  # 10 %: kept every pair
        (
            ["--benchmark", ""],
            "argument --benchmark: must name a file or folder; got ''",
        ),  # was "benchmark file . is a folder"
        (["--benchmark", os.devnull], "is not a regular file"),  # was "does not exist"
        (
            ["--benchmark", str(GPT2), "--out", ""],
            "argument --out: must name a file or folder; got ''",
        ),  # exit 0 before
        (["--benchmark", str(GPT2), "--overwrite"], "--overwrite would be ignored: it replaces an --out file"),
    ],
)
def test_rank_cli_bad_input_is_one_line(args, message, capsys):
    assert main(["rank", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_rank_out_follows_the_one_output_rule(tmp_path, capsys):
    """docs/outputs.md: an existing --out is replaced only with --overwrite, and never the benchmark it reads."""
    bench = tmp_path / "bench.json"
    bench.write_text(GPT2.read_text())
    out = tmp_path / "report.json"
    out.write_text("mine")
    for argv in (["--out", str(out)], ["--out", str(bench), "--overwrite"]):
        capsys.readouterr()
        assert main(["rank", "--benchmark", str(bench), "--json", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
    assert out.read_text() == "mine" and bench.read_text() == GPT2.read_text()
    assert main(["rank", "--benchmark", str(bench), "--json", "--out", str(out), "--overwrite"]) == 0
    assert json.loads(out.read_text())["provenance"]


def test_rows_without_the_target_are_skipped_and_reported(tmp_path, capsys):
    # 2 of 12 LTS rows lack valid_ppl (one has no key, one holds null): the other 10 are scored exactly as a
    # file holding only them, the skipped ids are reported (text, JSON, stderr note), and --strict refuses.
    data = dict(list(json.loads(GPT2.read_text()).items())[:12])
    names = list(data)
    del data[names[2]]["valid_ppl"]
    data[names[7]]["valid_ppl"] = None
    path = write(tmp_path, data, "missing.json")
    complete = write(tmp_path, {k: v for k, v in data.items() if k not in (names[2], names[7])}, "complete.json")
    bench = load_benchmark(path)
    assert len(bench) == 10 and bench.skipped == (names[2], names[7]) and names[2] not in bench.ids
    report, reference = ranking.rank_benchmark(bench), ranking.rank_benchmark(load_benchmark(complete))
    assert report["n"] == 10 and report["methods"] == reference["methods"]
    assert report["skipped"] == {
        "count": 2,
        "rows_in_file": 12,
        "reason": "no 'valid_ppl' value",
        "ids": [names[2], names[7]],
    }
    assert reference["skipped"]["count"] == 0
    assert load_benchmark(path, target="test_ppl").skipped == ()  # test_ppl is present in every row

    assert main(["rank", "--benchmark", str(path)]) == 0
    assert f"skipped 2 of 12 rows: no 'valid_ppl' value ({names[2]}, {names[7]})" in capsys.readouterr().out
    assert main(["rank", "--benchmark", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["skipped"]["count"] == 2 and "skipped 2 of 12 rows" in captured.err
    assert main(["rank", "--benchmark", str(path), "--strict"]) == 2
    err = capsys.readouterr().err
    assert "must be present in every row (--strict); got 2 of 12 rows without it" in err and err.count("\n") == 1
    with pytest.raises(InvalidInputError, match="must be present in some rows; got none in 12 rows"):
        load_benchmark(write(tmp_path, {k: {**v, "valid_ppl": None} for k, v in data.items()}, "none.json"))


def test_generic_format_rows_without_target_are_skipped(tmp_path):
    archs = [
        {"id": c, "config": c, "target": t}
        for c, t in (("8:8:8:8:8", 50.0), ("16:16:16:16:16", 60.0), ("64:64:64:64:64", 70.0))
    ]
    archs += [{"id": "no-target", "config": "32:32:32:32:32"}]
    path = nats_file(tmp_path, archs)
    bench = load_benchmark(path)
    assert bench.ids == ("8:8:8:8:8", "16:16:16:16:16", "64:64:64:64:64") and bench.skipped == ("no-target",)
    with pytest.raises(InvalidInputError, match="--strict"):
        load_benchmark(path, strict=True)


def test_rank_cli_head_dim(tmp_path, capsys):
    configs = [
        {"layer_num": d, "embed_dim": e, "num_heads": h, "mlp_ratio": r}
        for d, e, h, r in (
            (12, 320, 5, 3.0),
            (13, 384, 6, 3.5),
            (14, 448, 7, 4.0),
            (12, 448, 6, 3.5),
            (14, 320, 7, 4.0),
        )
    ]
    archs = [
        {"id": str(i), "config": c, "target": t}
        for i, (c, t) in enumerate(zip(configs, (78.1, 79.5, 81.0, 80.2, 78.9)))
    ]
    path = write(
        tmp_path,
        {
            "format": "nsc-ranking",
            "higher_is_better": True,
            "family": "autoformer",
            "target": "top1",
            "architectures": archs,
        },
    )
    reports = {}
    for head_dim in ("64", "embed", None):
        assert main(["rank", "--benchmark", str(path), "--json", *(["--head-dim", head_dim] if head_dim else [])]) == 0
        reports[head_dim] = json.loads(capsys.readouterr().out)
    assert reports["embed"]["options"]["head_dim"] == "embed" and reports["64"]["options"]["head_dim"] == 64
    assert reports[None]["options"] == reports["64"]["options"]
    assert parse_head_dim("0" * 5000 + "64") == 64  # leading zeros count against int()'s 4,300 digits
    for text in ("sixty", str(2**70), "²", "9" * 5000, "0" * 5000):  # 2**70: numpy's OverflowError; '²', 5000: int()'s
        assert main(["rank", "--benchmark", str(path), "--head-dim", text]) == 2
        err = capsys.readouterr().err
        message = f"--head-dim must be a whole number in [1, 65536] such as 64, or 'embed'; got '{text}'"
        assert message in err and err.count("\n") == 1
    assert main(["rank", "--benchmark", str(GPT2), "--head-dim", "embed"]) == 2
    assert "family 'gpt2' has no option(s) ['head_dim']" in capsys.readouterr().err


def autoformer_rows(n: int = 4) -> dict:
    """A small autoformer-ood file: embed_dim grows with the row, and so do params, flops and accuracy."""
    return {
        str(i): {
            "net_setting": {"layer_num": 12, "embed_dim": 192 + 24 * i, "num_heads": [3] * 12, "mlp_ratio": [4.0] * 12},
            "performance": {"Imagenet": {"clean": 70.0 + i}},
            "params": 5.0 + i,
            "flops": 1000.0 + 100 * i,
        }
        for i in range(n)
    }


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: d["1"].pop("flops"), r"'flops' must be in every row or in none; got 1 of 4 rows without it \(1\)"),
        (lambda d: d["1"].update(flops=-5.0), r"'flops' of row '1' must be > 0; got -5"),
        (lambda d: d["1"].update(flops=0), r"'flops' of row '1' must be > 0; got 0"),
        (lambda d: d["2"]["performance"]["Imagenet"].update(clean=500.0), r"row '2' must be in \[0, 100\]; got 500"),
        (lambda d: d["2"]["performance"]["Imagenet"].update(clean=-5.0), r"row '2' must be in \[0, 100\]; got -5"),
        (lambda d: d["3"]["net_setting"].update(mlp_ratio=True), "a ratio must be a number; got True"),
        (lambda d: d["3"]["net_setting"].update(embed_dim=10**30), "a size must be at most 1,048,576"),
    ],
)
def test_an_autoformer_file_with_impossible_values_is_refused(tmp_path, damage, message):
    data = autoformer_rows()
    assert ranking.rank_benchmark(load_benchmark(write(tmp_path, data)))["n"] == 4
    damage(data)
    with pytest.raises(InvalidInputError, match=message):
        ranking.rank_benchmark(load_benchmark(write(tmp_path, data)))


def test_the_params_note_says_when_the_count_is_not_autoformer_s_own(tmp_path):
    bench = load_benchmark(write(tmp_path, autoformer_rows()))
    ours = ranking.rank_benchmark(bench, families.make_options("autoformer", head_dim="embed"))["baselines"]
    assert ours["params"].startswith("all parameters at head_dim embed")
    assert "equals AutoFormer's own" in ranking.rank_benchmark(bench)["baselines"]["params"]


def test_a_name_written_twice_in_an_object_file_is_refused_not_dropped(tmp_path):
    rows = list(json.loads(GPT2.read_text()).items())[:3]
    text = json.dumps(dict(rows))
    twice = text[:-1] + ", " + json.dumps(rows[0][0]) + ": " + json.dumps(rows[0][1]) + "}"  # the last one won
    with pytest.raises(InvalidInputError, match=f"the key '{rows[0][0]}' appears more than once in one object"):
        load_benchmark(write(tmp_path, twice))


def test_sizes_beyond_int64_products_and_odd_ids_are_refused(tmp_path):
    data = json.loads(GPT2.read_text())
    key = next(iter(data))
    data[key]["config"]["d_model"] = 2**33  # its square overflowed int64 silently
    with pytest.raises(InvalidInputError, match=f"'{key}': malformed GPT-2 config \\(a size must be at most 1,048,576"):
        load_benchmark(write(tmp_path, data)).batch()
    rows = json.loads(FLEXIBERT.read_text())[:3]
    rows[1]["id"] = None  # was ranked as "None"
    with pytest.raises(InvalidInputError, match="architecture #1: 'id' must be a string or integer; got None"):
        load_benchmark(write(tmp_path, rows))


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(tmp_path, monkeypatch, capsys):
    """`nsc-prune rank ... | head -1` printed "nsc-prune: error: Broken pipe" and exited 2."""
    import io

    class ClosedPipe(io.StringIO):
        def __init__(self, fd: int):
            super().__init__()
            self.fd = fd

        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self) -> int:
            return self.fd

    with open(tmp_path / "stdout", "w") as held:
        monkeypatch.setattr("sys.stdout", ClosedPipe(held.fileno()))
        assert main(["rank", "--benchmark", str(GPT2)]) == 141
    assert capsys.readouterr().err == ""


def test_a_damaged_first_row_is_named_as_a_row_not_an_unknown_format(tmp_path):
    data = json.loads(GPT2.read_text())
    first = next(iter(data))
    data[first] = "x"  # was "unrecognised benchmark format", where the same damage in row 2 is named
    with pytest.raises(InvalidInputError, match=f"row '{first}' is malformed \\(a str, not an object\\)"):
        load_benchmark(write(tmp_path, data))
    data = json.loads(GPT2.read_text())
    del data[first]["valid_ppl"], data[first]["test_ppl"]
    assert load_benchmark(write(tmp_path, data)).skipped == (first,)


@pytest.mark.parametrize("std", [1e-151, 1e-320])
def test_a_std_so_small_that_capacities_underflow_is_named(std):
    """rank said "scores and targets must be finite numbers"; the search collapsed its front to the narrowest plan
    and called it the full model. The bound keeps std^2, and so psi_MP ~ m n std^2, a normal float."""
    assert psi_mp(1, 1, MIN_INIT_STD) > 0 and np.isfinite(np.log(psi_mp(1, 1, MIN_INIT_STD)))
    bench = load_benchmark(GPT2)
    with pytest.raises(InvalidInputError, match=f"init std {std!r} is below 1e-150: psi_MP ~ m n std"):
        families.make_options(bench.family, init=std)
    with pytest.raises(InvalidInputError, match="below 1e-150"):
        parse_init(str(std))

"""Spec builders of the paper's other families: shapes, counts, conventions, bad input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from nsc_prune.core.capacity import init_std, psi_mp
from nsc_prune.errors import InvalidInputError
from nsc_prune.ranking import families
from nsc_prune.ranking.benchmarks import AUTOFORMER_TINY_FILE, benchmarks_dir, missing_benchmark_note
from nsc_prune.ranking.families import cnn
from nsc_prune.ranking.families.base import aggregate

ROOT = Path(__file__).resolve().parents[2]
GPT2_FILE = ROOT / "evals/ranking/lts_gpt2_wt103_200.json"
AUTOFORMER_FILE = benchmarks_dir() / AUTOFORMER_TINY_FILE

FLEXI = {
    "hidden_size": 256,
    "encoder_layers": [
        {
            "operation_type": "SA",
            "operation_parameter": "SDP",
            "num_operation_heads": 4,
            "feed_forward_dimension": 1024,
            "num_feed_forward": 3,
        },
        {
            "operation_type": "LT",
            "operation_parameter": "DFT",
            "num_operation_heads": 2,
            "feed_forward_dimension": 512,
            "num_feed_forward": 1,
        },
        {
            "operation_type": "DSC",
            "operation_parameter": 9,
            "num_operation_heads": 2,
            "feed_forward_dimension": 512,
            "num_feed_forward": 3,
        },
    ],
}
GPT2 = {"d_model": 256, "n_layer": 3, "n_head": [2, 4, 8], "d_inner": [1000, 512, 2048]}
AUTOFORMER = {"layer_num": 3, "embed_dim": [192, 192, 192], "num_heads": [3, 4, 3], "mlp_ratio": [3.5, 4.0, 4.0]}
NATS = "8:16:32:48:64"
OFA = {"ks": [3, 5, 7, 3] * 5, "e": [3, 4, 6, 4] * 5, "d": [2, 3, 4, 2, 3], "r": 224}
EXAMPLES = {"flexibert": FLEXI, "gpt2": GPT2, "autoformer": AUTOFORMER, "nats-sss": NATS, "ofa-mbv3": OFA}


def shapes(option):
    return sorted((m.name, m.rows, m.cols, m.count) for m in option.matrices)


def psi(m, n, init):
    return float(psi_mp(m, n, init_std(m, n, init)))


# ---------------------------------------------------------------------------------------------
# contract suite over the registry


def test_every_family_has_an_example():
    assert set(EXAMPLES) == set(families.FAMILIES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_batch_matches_single_architecture_spec(name):
    """The batched Psi_l equal the LayerOption path (independent psi_mp calls per layer), for
    a batch mixing the example with itself (so rows share layers)."""
    config = EXAMPLES[name]
    batch = families.build_batch(name, [config, config])
    options = families.layer_options(name, config)
    assert len(options) == int(batch.mask[0].sum())
    np.testing.assert_allclose(batch.layer_capacity()[0][batch.mask[0]], [o.nsc for o in options], rtol=1e-12)
    np.testing.assert_allclose(families.score(name, [config]), sum(o.nsc for o in options), rtol=1e-12)
    assert batch.params()[0] == sum(o.params for o in options) + batch.extra_params[0]
    assert batch.macs()[0] > 0


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_options_contract(name):
    fam = families.get_family(name)
    defaults = fam.options_class()
    assert families.make_options(name) == defaults
    assert dataclasses.replace(defaults) == defaults
    with pytest.raises(InvalidInputError, match=f"family '{name}' has no option"):
        families.make_options(name, no_such_option=1)
    with pytest.raises(InvalidInputError):
        families.score(name, [EXAMPLES[name]], options=families.make_options(name, init="glorot"))
    other = next(n for n in sorted(EXAMPLES) if families.get_family(n).options_class is not fam.options_class)
    for wrong in ({"init": 0.02}, families.make_options(other)):  # a dict, another family's options
        with pytest.raises(InvalidInputError, match=f"options for family '{name}' must be its"):
            families.score(name, [EXAMPLES[name]], options=wrong)


@pytest.mark.parametrize("name", ["flexibert", "gpt2", "autoformer"])
def test_attention_conventions_are_shared(name):
    for attention in ("per_head", "merged"):
        assert families.make_options(name, attention=attention).attention == attention
    with pytest.raises(InvalidInputError, match=r"attention must be one of \('per_head', 'merged'\); got 'grouped'"):
        families.make_options(name, attention="grouped")


def test_unknown_family_lists_close_matches():
    with pytest.raises(InvalidInputError, match="Did you mean autoformer"):
        families.get_family("autoformr")


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_aggregations(name):
    batch = families.build_batch(name, [EXAMPLES[name]])
    layer = batch.layer_capacity()[0][batch.mask[0]]
    for how, expected in (("sum", layer.sum()), ("min", layer.min()), ("product", np.prod(layer))):
        np.testing.assert_allclose(aggregate(batch.layer_capacity(), batch.mask, how), [expected], rtol=1e-12)
    with pytest.raises(InvalidInputError, match="aggregation must be one of"):
        aggregate(batch.layer_capacity(), batch.mask, "mean")


# ---------------------------------------------------------------------------------------------
# FlexiBERT


def test_flexibert_declared_spec():
    sa, lt, dsc = families.layer_options("flexibert", FLEXI)
    assert shapes(sa) == [
        ("ffn_down", 256, 341, 3),
        ("ffn_up", 341, 256, 3),
        ("o_proj", 256, 256, 1),
        ("qkv_proj", 768, 256, 1),
    ]
    assert shapes(lt) == [("ffn_down", 256, 512, 1), ("ffn_up", 512, 256, 1), ("lt_dense", 256, 256, 2)]
    assert shapes(dsc) == [("dsc_dense", 256, 256, 1), ("ffn_down", 256, 170, 3), ("ffn_up", 170, 256, 3)]
    # Xavier std per matrix (appendix H)
    expected = (
        psi(768, 256, "xavier") + psi(256, 256, "xavier") + 3 * (psi(341, 256, "xavier") + psi(256, 341, "xavier"))
    )
    assert sa.nsc == pytest.approx(expected, rel=1e-12)


def test_flexibert_trained_structure_and_per_head():
    opts = families.make_options("flexibert", ffn="trained", attention="per_head")
    sa, lt, _ = families.layer_options("flexibert", FLEXI, opts)
    # H -> 4H, then num_feed_forward - 1 = 2 dense layers of width F, then back to H
    assert shapes(sa) == [
        ("ffn_output", 256, 1024, 1),
        ("intermediate", 1024, 256, 1),
        ("intermediate_1", 1024, 1024, 1),
        ("intermediate_n", 1024, 1024, 1),
        ("o_proj", 256, 256, 1),
        ("qkv_proj_per_head", 64, 256, 12),
    ]
    assert shapes(lt) == [("ffn_output", 256, 1024, 1), ("intermediate", 1024, 256, 1), ("lt_dense", 256, 256, 2)]


def test_flexibert_bad_shapes_name_the_row():
    bad = json.loads(json.dumps(FLEXI))
    bad["encoder_layers"][2]["num_operation_heads"] = 3
    with pytest.raises(
        InvalidInputError, match=r"architecture '1', layer 2: num_operation_heads=3 does not divide hidden_size=256"
    ):
        families.build_batch("flexibert", [FLEXI, bad])
    bad = json.loads(json.dumps(FLEXI))
    bad["encoder_layers"][1]["operation_type"] = "CONV"
    with pytest.raises(
        InvalidInputError,
        match=r"architecture 'x', layer 1: operation_type must be one of \('SA', 'LT', 'DSC'\); got 'CONV'",
    ):
        families.build_batch("flexibert", [bad], ids=["x"])
    bad = json.loads(json.dumps(FLEXI))
    bad["encoder_layers"][2]["feed_forward_dimension"] = 2  # 2 // 3 = 0: a zero-width declared branch
    with pytest.raises(
        InvalidInputError, match=r"architecture '0', layer 2: feed_forward_dimension // num_feed_forward .* got 0$"
    ):
        families.build_batch("flexibert", [bad])
    trained = families.make_options("flexibert", ffn="trained")  # no branches there: F = 2 is a (tiny) dense layer
    assert families.build_batch("flexibert", [bad], options=trained).mask.sum() == 3
    with pytest.raises(InvalidInputError, match="architecture '0': missing FlexiBERT field 'hidden_size'"):
        families.build_batch("flexibert", [{"encoder_layers": []}])
    with pytest.raises(InvalidInputError, match="has no layers"):
        families.build_batch("flexibert", [FLEXI, {"hidden_size": 128, "encoder_layers": []}])


# ---------------------------------------------------------------------------------------------
# GPT-2 / Transformer-XL


def test_gpt2_per_head_and_merged():
    layer0 = families.layer_options("gpt2", GPT2)[0]
    assert shapes(layer0) == [
        ("ff_down", 256, 1000, 1),
        ("ff_up", 1000, 256, 1),
        ("o_proj", 256, 256, 1),
        ("qkv_proj_per_head", 128, 256, 6),
    ]
    merged = families.layer_options("gpt2", GPT2, families.make_options("gpt2", attention="merged"))[0]
    assert ("qkv_proj", 768, 256, 1) in shapes(merged)
    assert merged.params == layer0.params  # same weights, different spectral split
    assert layer0.nsc > merged.nsc  # 3d sub-channels at SNR d s^2 beat d at 3d s^2 (ln is concave)


def test_gpt2_params_equal_lts_nonembedding_count():
    data = json.loads(GPT2_FILE.read_text())
    batch = families.build_batch("gpt2", [v["config"] for v in data.values()], ids=list(data))
    np.testing.assert_array_equal(batch.params(), [int(v["params"]["nonembedding"]) for v in data.values()])
    d, f = 256, np.array(GPT2["d_inner"])
    one = families.build_batch("gpt2", [GPT2])
    assert one.params()[0] == np.sum(4 * d * d + 9 * d + f * (2 * d + 1)) + 2 * d  # + final LayerNorm


def test_gpt2_bad_input():
    with pytest.raises(InvalidInputError, match=r"architecture 'a', layer 1: n_head=3 does not divide d_model=256"):
        families.build_batch("gpt2", [{**GPT2, "n_head": [2, 3, 8]}], ids=["a"])
    with pytest.raises(InvalidInputError, match="n_layer=4 but n_head has 3"):
        families.build_batch("gpt2", [{**GPT2, "n_layer": 4}])
    assert families.build_batch("gpt2", [{"d_model": 64, "n_layer": 2, "n_head": 2, "d_inner": 128}]).mask.sum() == 2
    same = families.build_batch("gpt2", [{"d_model": "64", "n_layer": 2.0, "n_head": 2, "d_inner": 128}])
    plain = families.build_batch("gpt2", [{"d_model": np.int64(64), "n_layer": 2, "n_head": 2, "d_inner": 128}])
    assert same.params().tolist() == plain.params().tolist()  # exact whole numbers in another type are read
    for bad, shown in ((128.5, "128.5"), ("abc", "'abc'"), (True, "True"), (None, "None")):
        with pytest.raises(InvalidInputError, match=f"a size must be a whole number; got {shown}"):  # int() cut 128.5
            families.build_batch("gpt2", [{**GPT2, "d_model": bad}])
    with pytest.raises(InvalidInputError, match="'a', layer 1: n_head must be a positive integer; got 0"):
        families.build_batch("gpt2", [{**GPT2, "n_head": [2, 0, 8]}], ids=["a"])  # was "does not divide"
    with pytest.raises(InvalidInputError, match="n_layer must be a positive integer; got -1"):
        families.build_batch("gpt2", [{**GPT2, "n_layer": -1}])


def test_layer_permutation_invariance():
    shuffled = {**GPT2, "n_head": GPT2["n_head"][::-1], "d_inner": GPT2["d_inner"][::-1]}
    a, b = families.score("gpt2", [GPT2, shuffled])
    assert a == pytest.approx(b, rel=1e-14)


# ---------------------------------------------------------------------------------------------
# AutoFormer


def test_autoformer_head_dim_64_spec():
    first = families.layer_options("autoformer", AUTOFORMER)[0]
    assert shapes(first) == [
        ("fc1", 672, 192, 1),
        ("fc2", 192, 672, 1),
        ("proj", 192, 192, 1),
        ("qkv_proj_per_head", 64, 192, 9),
    ]


def test_autoformer_params_equal_file_counts():
    if not AUTOFORMER_FILE.exists():
        pytest.skip(f"not redistributable: {missing_benchmark_note(AUTOFORMER_FILE)}")
    data = json.loads(AUTOFORMER_FILE.read_text())
    batch = families.build_batch("autoformer", [v["net_setting"] for v in data.values()])
    np.testing.assert_allclose(batch.params() / 1e6, [v["params"] for v in data.values()], atol=5e-7)


def test_autoformer_bad_input():
    with pytest.raises(InvalidInputError, match="embed_dim differs across layers"):
        families.build_batch("autoformer", [{**AUTOFORMER, "embed_dim": [192, 216, 192]}])
    with pytest.raises(
        InvalidInputError, match=r"architecture '0', layer 1: num_heads must be a positive integer; got 0$"
    ):
        families.build_batch("autoformer", [{**AUTOFORMER, "num_heads": [3, 0, 3]}])
    with pytest.raises(InvalidInputError, match="mlp_ratio must be positive numbers; got \\[nan"):
        families.build_batch("autoformer", [{**AUTOFORMER, "mlp_ratio": float("nan")}])
    with pytest.raises(InvalidInputError, match="layer_num must be a positive integer; got 0"):
        families.build_batch("autoformer", [{**AUTOFORMER, "layer_num": 0}])
    with pytest.raises(InvalidInputError, match="the MLP width\\) must be at most 1,048,576; got 1e\\+16 \\* 192"):
        families.build_batch("autoformer", [{**AUTOFORMER, "mlp_ratio": 1e16}])  # int64 products wrapped, exit 0


# ---------------------------------------------------------------------------------------------
# CNNs


def test_conv_and_depthwise_reshape():
    conv = cnn.conv_role("c", 64, 32, 3, 1, "kaiming")
    assert (int(conv.rows), int(conv.cols)) == (64, 288) and float(conv.std) == pytest.approx(np.sqrt(2 / 288))
    dw = cnn.depthwise_role("dw", 96, 5, 1, "kaiming")
    assert (int(dw.rows), int(dw.cols)) == (96, 25)


def test_nats_layers_and_params():
    stem, cell0, res1, *_ = families.layer_options("nats-sss", NATS)
    assert shapes(stem) == [("stem", 8, 27, 1)]
    assert shapes(cell0) == [
        ("cell_conv", 8, 72, 3),
        ("cell_conv_from_input", 8, 72, 2),
    ]  # C_in == C_out: identity skip
    assert shapes(res1) == [("res_conv_a", 16, 72, 1), ("res_conv_b", 16, 144, 1), ("res_downsample_1x1", 16, 8, 1)]
    small, big = families.score("nats-sss", ["8:8:8:8:8", "64:64:64:64:64"])
    assert big > small
    # 8 channels everywhere, CIFAR-100 head: convs + BatchNorms + last BN + classifier, counted by hand
    convs = 8 * 27 + 5 * 8 * 72 + 2 * (8 * 72 + 8 * 72 + 8 * 8) + 5 * 8 * 72 + 5 * 8 * 72
    bns = 2 * 8 * (1 + 5 + 2 + 5 + 2 + 5) + 2 * 8
    assert families.build_batch("nats-sss", ["8:8:8:8:8"]).params()[0] == convs + bns + 8 * 100 + 100
    with pytest.raises(InvalidInputError, match="5 channel counts"):
        families.score("nats-sss", ["8:16:32"])
    with pytest.raises(
        InvalidInputError,
        match=r"architecture '1', stage 2: channels must be one of \(8, 16, 24, 32, 40, 48, 56, 64\); got 12$",
    ):
        families.score("nats-sss", [NATS, "8:16:12:48:64"])
    with pytest.raises(InvalidInputError, match=r"architecture '0', stage 0: channels must be one of .*; got 0$"):
        families.score("nats-sss", ["0:16:32:48:64"])
    for size in (16, 32):  # ImageNet16-120, CIFAR
        families.make_options("nats-sss", image_size=size)
    with pytest.raises(InvalidInputError, match=r"image_size must be a multiple of 4; got 30$"):  # MACs were counted
        families.make_options("nats-sss", image_size=30)


def test_ofa_depth_mask_and_monotonicity():
    batch = families.build_batch("ofa-mbv3", [OFA])
    assert int(batch.mask.sum()) == 4 + sum(OFA["d"])
    block = families.layer_options("ofa-mbv3", OFA)[2]  # stage 1, block 0: 16 -> 24, k=3, e=3
    assert shapes(block) == [("depthwise", 48, 9, 1), ("inverted_bottleneck", 48, 16, 1), ("point_linear", 24, 48, 1)]
    se_block = families.layer_options("ofa-mbv3", OFA)[4]  # stage 2 (SE), block 0: 24 -> 40, k=3, e=3
    assert ("se_reduce", 24, 72, 1) in shapes(se_block)
    largest = {"ks": [7] * 20, "e": [6] * 20, "d": [4] * 5}
    smallest = {"ks": [3] * 20, "e": [3] * 20, "d": [2] * 5}
    lo, mid, hi = families.score("ofa-mbv3", [smallest, OFA, largest])
    assert lo < mid < hi
    with pytest.raises(InvalidInputError, match=r"architecture '0', stage 0: d must be one of \(2, 3, 4\); got 5$"):
        families.score("ofa-mbv3", [{**OFA, "d": [5, 2, 2, 2, 2]}])
    with pytest.raises(
        InvalidInputError, match=r"architecture '1', block slot 3: ks must be one of \(3, 5, 7\); got 4$"
    ):
        families.score("ofa-mbv3", [OFA, {**OFA, "ks": [3, 5, 7, 4] * 5}])
    with pytest.raises(
        InvalidInputError, match=r"architecture '0', block slot 1: e must be one of \(3, 4, 6\); got 4.5$"
    ):
        families.score("ofa-mbv3", [{**OFA, "e": [3, 4.5] * 10}])
    with pytest.raises(InvalidInputError, match="needs 20 ks"):
        families.score("ofa-mbv3", [{**OFA, "ks": [3]}])
    # r = [] was an IndexError; [224, 160] and a string of 20 digits were read as something else
    with pytest.raises(InvalidInputError, match=r"architecture '0': malformed OFA arch \(r must be one resolution"):
        families.score("ofa-mbv3", [{**OFA, "r": []}])
    with pytest.raises(InvalidInputError, match=r"r must be one resolution; got \[224, 160\]"):
        families.score("ofa-mbv3", [{**OFA, "r": [224, 160]}])
    with pytest.raises(InvalidInputError, match=r"malformed OFA arch \(ks must be a list; got '3333"):
        families.score("ofa-mbv3", [{**OFA, "ks": "3" * 20}])


# AutoFormer-Small-shaped sample: (embed_dim, per-layer heads, per-layer MLP ratios); depth 12-14.
AUTOFORMER_SMALL = [
    (320, [5] * 6 + [6] * 6, [3.0] * 4 + [3.5] * 4 + [4.0] * 4),
    (384, [6] * 13, [3.5] * 13),
    (384, [7] * 7 + [5] * 7, [4.0] * 14),
    (448, [7] * 12 + [6] * 2, [3.0] * 10 + [4.0] * 4),
    (448, [5, 6, 7] * 4, [3.5, 4.0, 3.0] * 4),
]


def autoformer_small_configs():
    return [{"layer_num": len(h), "embed_dim": e, "num_heads": h, "mlp_ratio": r} for e, h, r in AUTOFORMER_SMALL]


def autoformer_expected_nsc(head_dim, attention="per_head"):
    # Independent of the family code: per layer Q/K/V (k x e per head, or one 3kh x e), proj e x kh, MLP pair;
    # k = 64 (the supernet's) or e // h (embed: Q/K/V e x e as a whole when h divides e).
    out = []
    for e, heads, ratios in AUTOFORMER_SMALL:
        total = 0.0
        for h, r in zip(heads, ratios):
            k, hid = (64 if head_dim == 64 else e // h), int(r * e)
            qkv = 3 * h * psi(k, e, "xavier") if attention == "per_head" else psi(3 * k * h, e, "xavier")
            total += qkv + psi(e, k * h, "xavier") + psi(hid, e, "xavier") + psi(e, hid, "xavier")
        out.append(total)
    return np.array(out)


@pytest.mark.parametrize("attention", ["per_head", "merged"])
def test_autoformer_head_dim_conventions(attention):
    configs = autoformer_small_configs()
    scores = {
        hd: families.score("autoformer", configs, families.make_options("autoformer", head_dim=hd, attention=attention))
        for hd in (64, "embed")
    }
    for hd, got in scores.items():
        np.testing.assert_allclose(got, autoformer_expected_nsc(hd, attention), rtol=1e-12)
    assert np.all(scores[64][[0, 2, 3, 4]] != scores["embed"][[0, 2, 3, 4]])
    assert scores[64][1] == pytest.approx(scores["embed"][1], rel=1e-12)  # 384 / 6 = 64: the conventions coincide
    if attention == "per_head":  # 64 (and per-head Q/K/V) stay the default
        np.testing.assert_array_equal(families.score("autoformer", configs), scores[64])
    else:  # embed, h divides e: Q/K/V as a whole are e x e (3e x e merged), proj e x e
        layer = families.layer_options(
            "autoformer", configs[1], families.make_options("autoformer", head_dim="embed", attention="merged")
        )[0]
        assert shapes(layer) == [
            ("fc1", 1344, 384, 1),
            ("fc2", 384, 1344, 1),
            ("proj", 384, 384, 1),
            ("qkv_proj", 1152, 384, 1),
        ]


def test_autoformer_head_dim_embed_params_and_bad_values():
    opts = families.make_options("autoformer", head_dim="embed")
    e, depth = 448, 12
    batch = families.build_batch(
        "autoformer", [{"layer_num": depth, "embed_dim": e, "num_heads": 7, "mlp_ratio": 4.0}], options=opts
    )
    k, hid = e // 7, 4 * e
    block = 3 * (e * 7 * k + 7 * k) + (7 * k * e + e) + (e * hid + hid) + (hid * e + e) + 4 * e + 4 * (2 * 14 + 2) * k
    network = e * 768 + e + e + 197 * e + 2 * e + 1000 * e + 1000
    assert batch.params()[0] == depth * block + network
    with pytest.raises(
        InvalidInputError, match=r"head_dim must be an integer in \[1, 65536\] such as 64, or 'embed'; got 'embd'"
    ):
        families.make_options("autoformer", head_dim="embd")
    with pytest.raises(InvalidInputError, match="got 65537"):  # np.full overflowed past int64; wraps came before
        families.make_options("autoformer", head_dim=65537)
    with pytest.raises(
        InvalidInputError, match="layer 0: embed_dim // num_heads .head_dim=embed. must be a positive integer; got 0"
    ):
        families.build_batch(
            "autoformer", [{"layer_num": 1, "embed_dim": 4, "num_heads": 5, "mlp_ratio": 4.0}], options=opts
        )


def _ofa_torch(config: dict):
    """OFA MobileNetV3 (width 1.0) in plain torch, from its published layout: what the MACs are checked against."""
    nn = pytest.importorskip("torch.nn")

    def divisible(v: float, d: int = 8) -> int:
        n = max(d, int(v + d / 2) // d * d)
        return n + d if n < 0.9 * v else n

    def block(c_in: int, c_out: int, k: int, stride: int, e: float, se: bool) -> list:
        mid = divisible(round(c_in * e)) if e != 1 else c_in
        layers = [nn.Conv2d(c_in, mid, 1, bias=False)] if e != 1 else []
        layers.append(nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False))
        if se:  # at one position: its MACs are its weights
            layers.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(mid, divisible(mid // 4), 1)))
            layers.append(nn.Conv2d(divisible(mid // 4), mid, 1))
        return [*layers, nn.Conv2d(mid, c_out, 1, bias=False)]

    layers, c_in = [nn.Conv2d(3, 16, 3, 2, 1, bias=False), *block(16, 16, 3, 1, 1, False)], 16
    stages = zip(cnn.OFA_STAGE_WIDTHS, cnn.OFA_STAGE_STRIDES, cnn.OFA_STAGE_SE, config["d"], strict=True)
    for stage, (width, stride, se, depth) in enumerate(stages):
        for j in range(depth):
            slot = stage * cnn.OFA_MAX_DEPTH + j
            layers += block(c_in, width, config["ks"][slot], stride if j == 0 else 1, config["e"][slot], se)
            c_in = width
    return layers


def _torch_macs(layers: list, resolution: int) -> int:
    """Multiply-accumulates of ``layers`` on one image: convs at their output positions, the head at one."""
    import torch

    x, macs = torch.zeros(1, 3, resolution, resolution), 0
    for layer in layers:
        if isinstance(layer, torch.nn.Sequential):  # the SE squeeze: pooled to one position
            x_se = layer(x)
            macs += x_se.numel() * layer[1].weight[0].numel()
            continue
        if layer.in_channels != x.shape[1]:  # the SE excite, back at the block's width: applied to the pooled map
            macs += layer.weight.numel()
            continue
        x = layer(x)
        macs += x[0].numel() * layer.weight[0].numel()
    positions = x.shape[2] * x.shape[3]
    return macs + positions * 160 * cnn.OFA_FINAL_EXPAND + cnn.OFA_FINAL_EXPAND * cnn.OFA_FEATURE_MIX + 1280 * 1000


@pytest.mark.parametrize("resolution", [224, 192, 208, 164, 130])
def test_ofa_macs_equal_a_torch_build_at_every_resolution(resolution):
    """A stride-2 conv with padding k // 2 has ceil(side / 2) positions a side: 208 -> 104, 52, 26, 13, 7 (the
    count took 6, -4.5 % MACs; at 164, -12.7 %). Only multiples of 32 were right."""
    config = {**OFA, "r": resolution}
    expected = _torch_macs(_ofa_torch(config), resolution)
    assert int(families.build_batch("ofa-mbv3", [config]).macs()[0]) == expected


def test_macs_beyond_int64_are_refused_not_wrapped():
    """Each size is capped at 2**20, but a product of four over thousands of layers is not: the count wrapped
    around to a smaller number than a smaller network's, and #FLOPs ranked them backwards."""
    huge = {"d_model": 2**20, "n_layer": 2**12, "n_head": 1, "d_inner": 2**20}
    with pytest.raises(InvalidInputError, match=r"architecture '1': .* multiply-accumulates, beyond the 64-bit"):
        families.build_batch("gpt2", [GPT2, huge]).macs()
    assert families.build_batch("gpt2", [GPT2]).macs()[0] > 0

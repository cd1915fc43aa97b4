"""Channel selection (issue 6 item 2): orders are permutations, extraction honours them exactly,
``activation`` finds the channels that a constructed model makes loud, bad calibration input exits 2."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_extract_heads_depth import ATOL, logits, masked_reference  # noqa: E402

from nsc_prune.cli import main  # noqa: E402
from nsc_prune.errors import InvalidInputError  # noqa: E402
from nsc_prune.hf.cut.keep import LayerOrder  # noqa: E402
from nsc_prune.hf.cut.selection import SelectionConfig, channel_orders  # noqa: E402
from nsc_prune.hf.extract import ExtractOptions, extract_plan  # noqa: E402
from nsc_prune.hf.weights.base import open_base  # noqa: E402
from nsc_prune.hf.weights.loading import load_pruned  # noqa: E402
from nsc_prune.plan import LayerPlan  # noqa: E402


@pytest.fixture
def ids():
    return torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))


def calib_text(path, words=600, seed=0):
    rng = random.Random(seed)
    path.write_text(" ".join(f"w{rng.randrange(3, 128)}" for _ in range(words)))
    return path


@pytest.mark.parametrize("method", ["first", "magnitude", "activation"])
def test_orders_are_permutations(tmp_path, tiny_llama, method):
    tiny = tiny_llama(gqa=True, lora=False)
    base = open_base(tiny.base)
    config = SelectionConfig(method, calib=str(calib_text(tmp_path / "c.txt")), calib_tokens=300)
    orders, record = channel_orders(base, config)
    assert len(orders) == 3 and record["method"] == method
    for order in orders:
        assert sorted(order.ffn) == list(range(96)) and sorted(order.kv_groups) == [0, 1]
    if method == "activation":
        assert record["calib_tokens"] == 300
    if method == "first":
        assert orders[0] == LayerOrder.identity(96, 2)


@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
def test_extraction_with_an_order_equals_masked_original(tmp_path, tiny_llama, ids, gqa):
    tiny = tiny_llama(gqa=gqa, lora=False)
    base = open_base(tiny.base)
    kv = tiny.config["num_key_value_heads"]
    rng = random.Random(3)
    orders = [LayerOrder(tuple(rng.sample(range(96), 96)), tuple(rng.sample(range(kv), kv))) for _ in range(3)]
    layers = [{"ffn": 40, "kv_groups": 1}, {"ffn": 96, "kv_groups": kv}, {"ffn": 0, "kv_groups": 0, "keep": False}]
    plans = [LayerPlan(**layer) for layer in layers]
    out = extract_plan(plans, base, tmp_path / "out", options=ExtractOptions(dtype="float32"), orders=orders)
    reference = masked_reference(tiny, layers, [(o.ffn, o.kv_groups) for o in orders])
    assert (logits(load_pruned(out), ids) - logits(reference, ids)).abs().max().item() <= ATOL
    # Not the prefix: the identity order gives other logits.
    prefix = masked_reference(tiny, layers)
    assert (logits(prefix, ids) - logits(reference, ids)).abs().max().item() > 1e-3


def test_activation_picks_the_loudest_channels(tmp_path, tiny_llama):
    """Channels 5, 17, 80 of layer 1 and KV group 1 of layer 2 are made 30x louder in the weights."""
    from safetensors.torch import load_file, save_file

    tiny = tiny_llama(gqa=True, lora=False, max_shard_size="10MB")
    path = tiny.base / "model.safetensors"
    weights = load_file(path)
    weights["model.layers.1.mlp.up_proj.weight"][[5, 17, 80]] *= 30  # hidden unit = silu(gate) * up
    weights["model.layers.2.self_attn.v_proj.weight"][16:32] *= 30  # group 1 = query heads 2, 3 (head_dim 16)
    save_file(weights, path, metadata={"format": "pt"})
    orders, _ = channel_orders(
        open_base(tiny.base), SelectionConfig("activation", calib=str(calib_text(tmp_path / "c.txt")))
    )
    assert set(orders[1].ffn[:3]) == {5, 17, 80}
    assert orders[2].kv_groups[0] == 1
    # magnitude sees the same channels from the weights alone
    magnitude, _ = channel_orders(open_base(tiny.base), SelectionConfig("magnitude"))
    assert set(magnitude[1].ffn[:3]) == {5, 17, 80} and magnitude[2].kv_groups[0] == 1


def test_magnitude_reads_a_channel_in_every_matrix_it_feeds(tmp_path, tiny_llama):
    """An FFN channel's down_proj column and a KV group's o_proj columns count as much as its input rows: loud
    only there, they still lead the order."""
    from safetensors.torch import load_file, save_file

    tiny = tiny_llama(gqa=True, lora=False, max_shard_size="10MB")
    path = tiny.base / "model.safetensors"
    weights = load_file(path)
    weights["model.layers.1.mlp.down_proj.weight"][:, [5, 17, 80]] *= 30
    weights["model.layers.2.self_attn.o_proj.weight"][:, 32:64] *= 30  # group 1 = query heads 2, 3 (head_dim 16)
    save_file(weights, path, metadata={"format": "pt"})
    magnitude, _ = channel_orders(open_base(tiny.base), SelectionConfig("magnitude"))
    assert set(magnitude[1].ffn[:3]) == {5, 17, 80} and magnitude[2].kv_groups[0] == 1


def test_a_kv_group_scores_its_own_query_heads_and_ties_keep_the_lower_index():
    """Scores of query heads [1, 1, 5, 5] in 2 groups: group 1 holds heads 2 and 3. Ties rank by index (a stable
    sort), so dead channels are cut from the end."""
    from nsc_prune.hf.cut.selection import _ranked, orders_from_scores

    (order,) = orders_from_scores([(torch.zeros(4), torch.tensor([1.0, 1.0, 5.0, 5.0]))], 2)
    assert order.kv_groups == (1, 0)
    assert _ranked([0.0] * 200) == tuple(range(200))


def test_activations_that_overflow_are_refused_not_ranked_as_the_first_channels(tmp_path, tiny_llama):
    """Calibration in float16 (or a model whose residual overflows) gave NaN scores, which sort as the identity:
    layers after it kept their first channels, with exit 0 and `selection: activation` recorded."""
    from safetensors.torch import load_file, save_file

    from nsc_prune.errors import ConfigError

    tiny = tiny_llama(gqa=True, lora=False, max_shard_size="10MB")
    path = tiny.base / "model.safetensors"
    weights = load_file(path)
    for name in ("gate_proj", "up_proj"):  # finite weights, but silu(gate) * up past float32's range
        weights[f"model.layers.1.mlp.{name}.weight"] *= 1e25
    save_file(weights, path, metadata={"format": "pt"})
    config = SelectionConfig("activation", calib=str(calib_text(tmp_path / "c.txt")))
    with pytest.raises(ConfigError, match=r"activations on the calibration text are not finite \(NaN or inf\) in "
                       r"float32 at layer 1: check the weights"):  # fmt: skip
        channel_orders(open_base(tiny.base), config)
    weights["model.embed_tokens.weight"][5, 0] = float("nan")  # a weight of its own: named, not the dtype
    save_file(weights, path, metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"the token embeddings hold NaN or inf values; no activation can be"):
        channel_orders(open_base(tiny.base), config)


@pytest.mark.parametrize(
    "case, message",
    [
        ("empty", "is empty"),
        ("binary", "is binary"),
        ("latin1", "is not UTF-8 text"),
        ("missing", "does not exist"),
        ("nocalib", "needs a calibration text"),
        # were ranked on as text, their JSON syntax included; hf: was "does not exist"
        ("calib.JSONL", "calib.JSONL is JSON; calibration reads plain text as written. Write the records' text"),
        ("hf:wikitext", "must be a text file; got the dataset hf:wikitext. Write its text to one"),
    ],
)
def test_bad_calibration_exits_2(tmp_path, tiny_llama, write_plan, capsys, case, message):
    tiny = tiny_llama(lora=False)
    plan = write_plan(tmp_path / "pareto.json", [{"ffn": 50}] * 3, tiny.config)
    calib = case if case.startswith("hf:") else tmp_path / (case if "." in case else "calib.txt")
    content = {"empty": b"  \n", "binary": b"\x89PNG\x00\x01\x02", "latin1": "caf\xe9 ol\xe9".encode("latin-1")}
    content["calib.JSONL"] = "\n".join(json.dumps({"text": f"w{i} " * 40}) for i in range(20)).encode()
    if case in content:
        calib.write_bytes(content[case])
    capsys.readouterr()
    argv = [
        "extract",
        "--pareto",
        str(plan),
        "--point",
        "0",
        "--base",
        str(tiny.base),
        "--out",
        str(tmp_path / "out"),
        "--selection",
        "activation",
    ] + ([] if case == "nocalib" else ["--calib", str(calib)])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
    with pytest.raises(InvalidInputError, match="must be one of"):
        SelectionConfig("random")


def test_cli_search_then_extract_with_activation(tmp_path, tiny_llama, capsys):
    tiny = tiny_llama(gqa=True, lora=False)
    search = [
        "--model",
        str(tiny.base),
        "--space",
        "ffn-grid",
        "--set",
        "ffn_step=16",
        "--set",
        "protect_layers=[0]",
        "--budget",
        "90%",
        "--out",
        str(tmp_path / "search"),
    ]
    assert main(search) == 0
    calib = calib_text(tmp_path / "calib.txt")
    argv = [
        "extract",
        "--pareto",
        str(tmp_path / "search"),
        "--base",
        str(tiny.base),
        "--out",
        str(tmp_path / "ckpt"),
        "--selection",
        "activation",
        "--calib",
        str(calib),
        "--calib-tokens",
        "300",
    ]
    assert main(argv) == 0
    assert "selection activation" in capsys.readouterr().out
    record = json.loads((tmp_path / "ckpt" / "nsc_prune_extract.json").read_text())
    assert record["selection"]["method"] == "activation" and record["selection"]["calib_tokens"] == 300
    assert len(record["selection"]["calib_sha256"]) == 64
    assert "Channel selection `activation`" in (tmp_path / "ckpt" / "README.md").read_text()
    assert record["plan"][0]["ffn"] == 96  # layer 0 protected
    model = load_pruned(tmp_path / "ckpt")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "ckpt")
    generated = model.generate(
        **tokenizer("w5 w6 w7", return_tensors="pt"), max_new_tokens=4, do_sample=False, pad_token_id=0
    )
    assert generated.shape == (1, 7)


@pytest.mark.slow
def test_smollm2_search_extract_activation_generates(tmp_path, smollm2_dir):
    """Issue 6 'must show': search at 80 % on ffn-grid, extract with activation selection, load, generate."""
    from pydoc_data.topics import topics

    search = [
        "--model",
        "smollm2-135m",
        "--space",
        "ffn-grid",
        "--set",
        "protect_layers=[0]",
        "--budget",
        "80%",
        "--out",
        str(tmp_path / "search"),
    ]
    assert main(search) == 0
    calib = tmp_path / "calib.txt"
    calib.write_text(topics["if"] + topics["while"] + topics["for"])
    argv = [
        "extract",
        "--pareto",
        str(tmp_path / "search"),
        "--budget",
        "80%",
        "--base",
        str(smollm2_dir),
        "--out",
        str(tmp_path / "ckpt"),
        "--selection",
        "activation",
        "--calib",
        str(calib),
        "--calib-tokens",
        "256",
    ]
    assert main(argv) == 0
    model = load_pruned(tmp_path / "ckpt", dtype="float32")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "ckpt")
    prompt = tokenizer("The capital of France is", return_tensors="pt")
    generated = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert generated.shape[1] == prompt["input_ids"].shape[1] + 8
    assert tokenizer.decode(generated[0, prompt["input_ids"].shape[1] :]).strip()


# ------------------------------------------------------------------------------ calibration memory and input


def test_streamed_calibration_equals_a_float32_model_and_holds_one_layer(tmp_path, tiny_llama, monkeypatch):
    """Scores equal those of the whole base loaded in float32 (hooks written here, independently), while
    at most one decoder layer has real weights at any time (the others stay on the meta device)."""
    import nsc_prune.hf.weights.loading
    from nsc_prune.hf.cut.selection import activation_scores

    tiny = tiny_llama(gqa=True, lora=False)
    base = open_base(tiny.base)
    ids = torch.randint(3, 128, (300,), generator=torch.Generator().manual_seed(0))
    seq_len = 128

    reference = transformers.LlamaForCausalLM.from_pretrained(tiny.base, dtype=torch.float32).eval()
    sums = [[0.0, 0.0] for _ in reference.model.layers]
    for i, layer in enumerate(reference.model.layers):

        def down(module, args, i=i):
            sums[i][0] = sums[i][0] + args[0].abs().flatten(0, 1).double().sum(0)

        def heads(module, args, i=i):
            sums[i][1] = sums[i][1] + args[0].abs().flatten(0, 1).double().reshape(-1, 4, 16).sum((0, 2))

        layer.mlp.down_proj.register_forward_pre_hook(down)
        layer.self_attn.o_proj.register_forward_pre_hook(heads)
    with torch.no_grad():
        for start in range(0, len(ids), seq_len):
            reference(ids[start : start + seq_len][None], use_cache=False)

    resident = []
    load = nsc_prune.hf.weights.loading.load_pruned

    def spying_load(*args, **kwargs):
        model = load(*args, **kwargs)
        layers = list(model.model.layers)

        def count(module, args):
            resident.append(sum(next(layer.parameters()).device.type != "meta" for layer in layers))

        for layer in layers:
            layer.mlp.register_forward_pre_hook(count)
        return model

    monkeypatch.setattr(nsc_prune.hf.weights.loading, "load_pruned", spying_load)
    scores = activation_scores(base, ids, seq_len)
    assert resident and max(resident) == 1
    for (ffn, head), (ref_ffn, ref_head) in zip(scores, sums, strict=True):
        torch.testing.assert_close(ffn, ref_ffn / 300, rtol=1e-12, atol=0)
        torch.testing.assert_close(head, ref_head / (300 * 16), rtol=1e-12, atol=0)


def test_calibration_needs_enough_tokens_and_a_tokenizer(tmp_path, tiny_llama, write_plan, capsys):
    from nsc_prune.hf.cut.selection import MIN_CALIB_TOKENS

    tiny = tiny_llama(lora=False)
    donor = tiny_llama(lora=False)  # the same word-level tokenizer
    plan = write_plan(tmp_path / "pareto.json", [{"ffn": 50}] * 3, tiny.config)
    short = tmp_path / "short.txt"
    short.write_text("w5 w6 w7")
    argv = ["extract", "--pareto", str(plan), "--point", "0", "--base", str(tiny.base), "--selection", "activation"]
    capsys.readouterr()
    assert main([*argv, "--calib", str(short), "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert f"has only 3 tokens; calibration needs at least {MIN_CALIB_TOKENS}" in err
    wider = tmp_path / "wider-tokenizer"  # another model's: its ids run past the base's 128-token vocabulary
    wider.mkdir()
    tokenizer = json.loads((donor.base / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"]["zz"] = 300
    (wider / "tokenizer.json").write_text(json.dumps(tokenizer))
    (wider / "tokenizer_config.json").write_text((donor.base / "tokenizer_config.json").read_text())
    many = tmp_path / "zz.txt"
    many.write_text(" ".join(["w5", "zz"] * 100))
    assert main([*argv, "--calib", str(many), "--tokenizer", str(wider), "--out", str(tmp_path / "z")]) == 2
    err = capsys.readouterr().err  # was an IndexError traceback from the embedding lookup
    assert "gives token id 300, but the base's vocabulary has 128 tokens" in err and len(err.splitlines()) == 1
    with pytest.raises(InvalidInputError, match=f"--calib-tokens must be an integer >= {MIN_CALIB_TOKENS}; got 10"):
        SelectionConfig("activation", calib="c.txt", calib_tokens=10)
    with pytest.raises(InvalidInputError, match="--calib-seq-len must be an integer >= 1; got True"):
        SelectionConfig("activation", calib="c.txt", seq_len=True)

    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tiny.base / name).unlink()
    calib = str(calib_text(tmp_path / "c.txt"))
    assert main([*argv, "--calib", calib, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "--base folder" in err and "has no tokenizer files" in err and "pass --tokenizer DIR" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    search = ["--model", str(tiny.base), "--space", "ffn-grid", "--set", "ffn_step=16", "--budget", "90%", "--quiet"]
    measured = ["--score", "measured", "--weights", str(tiny.base), "--calib", calib, "--out", str(tmp_path / "m")]
    assert main([*search, *measured]) == 2  # named --base and --tokenizer, flags the search does not have
    err = capsys.readouterr().err
    assert "--score measured tokenizes --calib with the model's tokenizer, but the --weights folder" in err, err
    assert "--tokenizer" not in err and "--base" not in err and len(err.strip().splitlines()) == 1
    # extraction copies the base's tokenizer only; the CLI prints the warning as one line
    assert main([*argv, "--calib", calib, "--tokenizer", str(donor.base), "--out", str(tmp_path / "c")]) == 0
    err = capsys.readouterr().err
    assert "nsc-prune: warning: " in err and "has no tokenizer files; add them" in err and "UserWarning" not in err
    record = json.loads((tmp_path / "c" / "nsc_prune_extract.json").read_text())
    assert record["selection"]["tokenizer"] == str(donor.base.resolve())


def _args(*flags: str):
    from nsc_prune.cli.extract import build_parser

    return build_parser().parse_args(["--pareto", "p.json", "--base", "b", "--out", "o", *flags])


def test_calib_is_refused_where_it_would_be_ignored(tmp_path):
    from nsc_prune.cli.extract import _selection

    with pytest.raises(InvalidInputError, match="--calib would be ignored: .* --adapter selects 'first'"):
        _selection(_args("--adapter", "lora/", "--calib", "c.txt"))
    with pytest.raises(InvalidInputError, match="--calib and --tokenizer would be ignored: .* --selection magnitude"):
        _selection(_args("--selection", "magnitude", "--calib", "c.txt", "--tokenizer", "tok/"))
    # the calibration's sizes too (they were ignored without a word), and without --calib the reason is no --calib
    sizes = ("--calib-tokens", "600", "--calib-seq-len", "64")
    with pytest.raises(InvalidInputError, match="--calib-tokens and --calib-seq-len would be ignored: .* 'magnitude'"):
        _selection(_args("--selection", "magnitude", *sizes))
    with pytest.raises(InvalidInputError, match="ignored: .* with no --calib the selection"):
        _selection(_args(*sizes[:2]))
    assert _selection(_args("--calib", "c.txt", *sizes)) == SelectionConfig(
        "activation", calib="c.txt", calib_tokens=600, seq_len=64
    )
    with pytest.warns(UserWarning, match="calibration runs on the base weights without the adapter"):
        assert (
            _selection(_args("--adapter", "lora/", "--selection", "activation", "--calib", "c.txt")).method
            == "activation"
        )
    assert _selection(_args("--calib", "c.txt")).method == "activation"


def test_cli_defaults_are_the_dataclass_defaults():
    from nsc_prune.cli.extract import _options, _selection, build_parser

    assert _options(_args()) == ExtractOptions()
    assert _selection(_args()) == SelectionConfig()
    assert _options(_args("--max-shard-size", "2GB", "--format", "padded")) == ExtractOptions(
        max_shard_size=2 * 10**9, format="padded"
    )
    assert f"(default: {ExtractOptions().max_shard_size / 2**30:g} GiB)" in " ".join(
        build_parser().format_help().split()
    )


@pytest.mark.parametrize(
    ("layers", "warned"),
    [
        ([{"ffn": 96}] * 3, False),  # the whole model (a healed checkpoint exported as GGUF, say): nothing chosen
        ([{"ffn": 96}, {"ffn": 0, "keep": False}, {"ffn": 96}], False),  # a layer dropped, the others whole
        ([{"ffn": 96}, {"ffn": 50}, {"ffn": 96}], True),
        ([{"ffn": 96}, {"ffn": 96, "kv_groups": 2}, {"ffn": 96}], True),
    ],
)
def test_the_first_channels_warning_only_where_a_kept_layer_is_cut(
    tmp_path, tiny_llama, write_plan, capsys, layers, warned
):
    """The warning said the first channels were kept, poorly, also where the plan cut no channel at all."""
    tiny = tiny_llama(lora=False)
    for config in (tiny.config, None):  # a front without the model's config (hand-written): read from the base
        plan = write_plan(tmp_path / "pareto.json", layers, config)
        out = tmp_path / f"o{config is None}"
        argv = ["extract", "--pareto", str(plan), "--point", "0", "--base", str(tiny.base), "--out", str(out)]
        assert main(argv) == 0  # it wrote the checkpoint, then failed with exit 2 reading the front's config
        assert ("kept the FIRST channels of each layer" in capsys.readouterr().err) == warned


def test_cli_provenance_records_the_quoted_command_line(tmp_path, tiny_llama, write_plan):
    import shlex

    tiny = tiny_llama(lora=False)
    plan = write_plan(tmp_path / "pareto.json", [{"ffn": 50}] * 3, tiny.config)
    argv = [
        "extract",
        "--pareto",
        str(plan),
        "--point",
        "0",
        "--base",
        str(tiny.base),
        "--selection",
        "magnitude",
        "--out",
        str(tmp_path / "my ckpt"),
    ]
    assert main(argv) == 0
    record = json.loads((tmp_path / "my ckpt" / "nsc_prune_extract.json").read_text())
    assert record["provenance"]["command"] == shlex.join(["nsc-prune", *argv])
    assert "'" in record["provenance"]["command"]  # the path with a space is quoted


@pytest.mark.parametrize("flag", ["--pareto", "--base", "--adapter", "--calib", "--tokenizer"])
def test_an_empty_input_path_is_refused_not_read_as_none_or_here(flag, capsys):
    from nsc_prune.cli.extract import build_parser

    argv = {"--pareto": "p.json", "--base": "b", "--out": "o", flag: ""}
    with pytest.raises(SystemExit) as exit_info:  # --calib '' kept the first channels; --base '' read '.'
        build_parser().parse_args([item for pair in argv.items() for item in pair])
    assert (
        exit_info.value.code == 2 and f"argument {flag}: must name a file or folder; got ''" in capsys.readouterr().err
    )


def test_the_record_holds_the_block_length_calibration_used(tmp_path, tiny_llama, write_plan, capsys):
    tiny = tiny_llama(lora=False)
    plan = write_plan(tmp_path / "pareto.json", [{"ffn": 50}] * 3, tiny.config)
    argv = ["extract", "--pareto", str(plan), "--base", str(tiny.base), "--calib", str(calib_text(tmp_path / "c.txt"))]
    context = tiny.config["max_position_embeddings"]
    assert main([*argv, "--calib-seq-len", str(100 * context), "--out", str(tmp_path / "o")]) == 0
    record = json.loads((tmp_path / "o" / "nsc_prune_extract.json").read_text())
    assert record["selection"]["seq_len"] == context  # said 100x the context, which it never ran


@pytest.mark.parametrize("seq_len, tokens", [(16, 200), (7, 200), (63, 64), (7, 64)])
def test_each_calibration_chunk_starts_with_bos_where_the_tokenizer_adds_one(tmp_path, tiny_llama, seq_len, tokens):
    """A served prompt starts with BOS on LLaMA's and Gemma's tokenizers: a chunk that did not put a text token at
    the model's first position (its attention sink), so calibration measured the model in a state it never runs in.
    Every chunk of the capped --calib-seq-len is BOS and the text's next tokens (a text's own leading BOS string,
    a chat template's, read once), at most --calib-tokens in all; a BOS-less tokenizer: the text's first tokens."""
    from nsc_prune.hf.cut.selection import calibration_tokens
    from tests.conftest import _tokenizer

    tiny = tiny_llama(lora=False)
    text = " ".join(f"w{30 + i % 70}" for i in range(600))  # no word starts with a special token's w1 or w2
    (tmp_path / "c.txt").write_text(text)
    config = SelectionConfig("activation", str(tmp_path / "c.txt"), calib_tokens=tokens, seq_len=seq_len)
    plain, plain_used = calibration_tokens(open_base(tiny.base), config)
    words = _tokenizer(128)(text)["input_ids"]
    assert plain.tolist() == words[:tokens] and "bos_each_window" not in plain_used
    _tokenizer(128, bos=True).save_pretrained(tiny.base)
    for calib in (text, f"w1 {text}"):
        (tmp_path / "c.txt").write_text(calib)
        ids, used = calibration_tokens(open_base(tiny.base), config)
        assert tokens - 1 <= len(ids) <= tokens and used["bos_each_window"] and used["calib_tokens"] == len(ids)
        assert ids[::seq_len].eq(1).all() and ids.eq(1).sum() == len(ids[::seq_len])
        assert ids[ids != 1].tolist() == words[: len(ids) - len(ids[::seq_len])]
    (tmp_path / "c.txt").write_text(text)
    one = dataclasses.replace(config, seq_len=1)  # a window of one would hold only the BOS: the text's tokens
    ids, used = calibration_tokens(open_base(tiny.base), one)
    assert ids.tolist() == words[:tokens] and "bos_each_window" not in used


def test_a_bos_past_the_vocabulary_is_refused_and_an_unnamed_bos_is_found(tmp_path, tiny_llama):
    """Another model's tokenizer whose BOS alone is past the base's embeddings was an IndexError deep in the
    streamed calibration; a tokenizer that adds a BOS its files do not name was read as adding none."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from nsc_prune.hf.cut.selection import calibration_tokens
    from nsc_prune.hf.weights.loading import bos_token_added

    def tokenizer(bos: str, named: bool):
        vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, 128)}, "<bos>": 128}
        backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        backend.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
        names = {"bos_token": bos} if named else {}
        return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="w2", **names)

    assert bos_token_added(tokenizer("w1", named=False)) == 1 == bos_token_added(tokenizer("w1", named=True))
    tiny = tiny_llama(lora=False)
    tokenizer("<bos>", named=True).save_pretrained(tiny.base)
    (tmp_path / "c.txt").write_text(" ".join(f"w{30 + i % 70}" for i in range(600)))
    config = SelectionConfig("activation", str(tmp_path / "c.txt"), calib_tokens=256)
    with pytest.raises(InvalidInputError, match=r"gives token id 128, but the base's vocabulary has 128 tokens"):
        calibration_tokens(open_base(tiny.base), config)


def test_a_calibration_text_the_tokenizer_reads_as_unknown_tokens_is_named(tmp_path, tiny_llama):
    from nsc_prune.hf.cut.selection import calibration_tokens

    tiny = tiny_llama(lora=False)
    (tmp_path / "c.txt").write_text("Prose in words the tiny vocabulary lacks. " * 100)
    config = SelectionConfig("activation", str(tmp_path / "c.txt"), calib_tokens=256)
    with pytest.warns(UserWarning, match=r"100% of the 256 tokens of the calibration text \S+c.txt are the tokenizer"):
        calibration_tokens(open_base(tiny.base), config)


@pytest.mark.slow
def test_calibration_tokenizes_a_prefix_that_gives_the_whole_texts_first_tokens(smollm2_dir, monkeypatch):
    import pydoc_data.topics

    from nsc_prune.hf.cut.selection import calibration_ids
    from nsc_prune.hf.weights import loading

    text = "\n\n".join(pydoc_data.topics.topics.values())  # about 800k characters of prose and code
    tokenizer = loading.load_tokenizer(smollm2_dir, "")
    whole = tokenizer(text, add_special_tokens=False)["input_ids"]
    seen = []

    def tokenize(piece, **kwargs):
        seen.append(len(piece))
        return tokenizer(piece, **kwargs)

    monkeypatch.setattr(loading, "load_tokenizer", lambda folder, fix: tokenize)
    for tokens in (64, 1000, 4096):
        assert calibration_ids(smollm2_dir, text, tokens).tolist() == whole[:tokens]
    assert max(seen) < len(text) // 10  # never the whole file: its memory grew with the file's size
    short = text[:5000]  # shorter than asked: all of it
    assert (
        calibration_ids(smollm2_dir, short, 10**6).tolist() == tokenizer(short, add_special_tokens=False)["input_ids"]
    )


def test_calib_without_selection_is_activation_and_not_warned_as_first(tmp_path, tiny_llama, write_plan, capsys):
    tiny = tiny_llama(lora=False)
    plan = write_plan(tmp_path / "pareto.json", [{"ffn": 96}, {"ffn": 50}, {"ffn": 96}], tiny.config)
    argv = ["extract", "--pareto", str(plan), "--point", "0", "--base", str(tiny.base), "--out", str(tmp_path / "o")]
    assert main([*argv, "--calib", str(calib_text(tmp_path / "c.txt"))]) == 0
    captured = capsys.readouterr()
    assert "selection activation" in captured.out and "kept the FIRST channels" not in captured.err
    assert json.loads((tmp_path / "o" / "nsc_prune_extract.json").read_text())["selection"]["method"] == "activation"

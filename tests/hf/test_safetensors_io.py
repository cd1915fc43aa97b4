"""The safetensors reader refuses damaged files in one line and the writer writes what it announces."""

from __future__ import annotations

import json
import struct

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load_file, save_file  # noqa: E402

from nsc_prune.errors import ConfigError, InvalidInputError  # noqa: E402
from nsc_prune.hf.weights import safetensors_io as io  # noqa: E402


def _raw(path, header, data=b""):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"", "is truncated \\(0 bytes\\)"),
        (b"\x05\x00\x00", "is truncated \\(3 bytes\\)"),
        (struct.pack("<Q", 4096) + b'{"w": ', "truncated or not a safetensors file \\(header of 4096 bytes\\)"),
    ],
    ids=["empty", "short", "cut-in-header"],
)
def test_a_file_cut_before_its_data_is_called_truncated(tmp_path, content, said):
    (tmp_path / "m.safetensors").write_bytes(content)
    with pytest.raises(InvalidInputError, match=said):
        io.read_header(tmp_path / "m.safetensors")


@pytest.mark.parametrize(
    ("offsets", "data", "said"),
    [
        ([[0, 8], [4, 12]], 12, "inconsistent data_offsets \\[4, 12\\]"),  # overlapping
        ([[0, 8], [16, 24]], 24, "inconsistent data_offsets \\[16, 24\\]"),  # a gap
        ([[0, 8], [8, 12]], 12, "inconsistent data_offsets \\[8, 12\\]"),  # shorter than its shape
        ([[0, 8], [8, 16]], 20, "is truncated or padded: header says \\d+ bytes, file has \\d+"),  # padded
    ],
    ids=["overlap", "gap", "short-range", "padded"],
)
def test_ranges_must_tile_the_data_to_the_end_of_the_file(tmp_path, offsets, data, said):
    header = {name: {"dtype": "F32", "shape": [2], "data_offsets": o} for name, o in zip("ab", offsets)}
    path = _raw(tmp_path / "m.safetensors", header, bytes(data))
    with pytest.raises(InvalidInputError, match=said):
        io.read_header(path)


def test_an_empty_tensor_listed_after_one_starting_where_it_does_is_read(tmp_path):
    """Sorted by (begin, end) as safetensors sorts: by begin alone, the empty tensor after `a` broke the tiling."""
    header = {
        "a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
        "b": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
    }
    path = _raw(tmp_path / "m.safetensors", header, bytes(6))
    assert {name: tuple(t.shape) for name, t in load_file(path).items()} == {"a": (3,), "b": (0,)}  # the reference
    infos = io.read_header(path)
    assert (infos["a"].shape, infos["b"].shape, infos["a"].end - infos["a"].start) == ((3,), (0,), 6)


def test_a_negative_dimension_is_refused_in_one_line(tmp_path):
    """Its product matched the bytes ((-1) x (-2) x 4 = 8): it was accepted, and torch raised on the read."""
    path = _raw(
        tmp_path / "m.safetensors", {"w": {"dtype": "F32", "shape": [-1, -2], "data_offsets": [0, 8]}}, bytes(8)
    )
    with pytest.raises(
        InvalidInputError, match=r"tensor w has a negative dimension in its shape \[-1, -2\]; re-download it$"
    ):
        io.read_header(path)


def test_an_integer_bias_is_refused_as_quantized_codes():
    info = io.TensorInfo("model.layers.0.self_attn.q_proj.bias", None, "I8", (4,), 0, 4)
    with pytest.raises(ConfigError, match="q_proj.bias is I8, the integer codes"):
        io.check_float_weights({info.name: info}, "here")
    io.check_float_weights({"model.mask": io.TensorInfo("model.mask", None, "BOOL", (4,), 0, 4)}, "here")


def test_the_stored_dtype_is_the_one_holding_most_bytes():
    infos = {
        "big": io.TensorInfo("big", None, "BF16", (100,), 0, 200),
        "norm": io.TensorInfo("norm", None, "F32", (10,), 200, 240),
        "ids": io.TensorInfo("ids", None, "I64", (1000,), 240, 8240),
    }
    assert io.stored_dtype(infos) == "bfloat16"
    assert io.stored_dtype({"ids": infos["ids"]}) == "float32"
    config = {"torch_dtype": "float32", "hidden_size": 8}
    assert io.with_stored_dtype(config, infos) == {"hidden_size": 8, "dtype": "bfloat16"}
    assert io.with_stored_dtype({"torch_dtype": "bfloat16"}, infos) == {"torch_dtype": "bfloat16"}


def test_a_safetensors_file_beside_an_index_that_is_not_one_of_its_shards_is_left_alone(tmp_path):
    """Only an unnamed shard of the index's own series is refused (a consolidated copy beside it is not read)."""
    save_file({"a": torch.ones(2)}, tmp_path / "model-00001-of-00001.safetensors")
    save_file({"a": torch.ones(2)}, tmp_path / "consolidated.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00001.safetensors"}})
    )
    assert list(io.index_model_dir(tmp_path)) == ["a"]


def test_a_tensor_in_a_shard_other_than_the_one_the_index_names_is_refused(tmp_path):
    save_file({"a": torch.ones(2), "c": torch.ones(2)}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({"b": torch.ones(2)}, tmp_path / "model-00002-of-00002.safetensors")
    index = {
        "weight_map": {
            "a": "model-00002-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
            "c": "model-00001-of-00002.safetensors",
        }
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        InvalidInputError, match="tensor a is in model-00001-of-00002.safetensors, where the index names model-00002"
    ):
        io.index_model_dir(tmp_path)


def test_an_index_listing_a_tensor_no_shard_holds_is_stale(tmp_path):
    save_file({"a": torch.ones(2)}, tmp_path / "model-00001-of-00001.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00001.safetensors", "b": "model-00001-of-00001.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InvalidInputError, match="lists tensors no shard holds \\(e.g. b\\); the index is stale"):
        io.index_model_dir(tmp_path)


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle"])
def test_every_pickle_suffix_is_named_and_never_read(tmp_path, suffix):
    (tmp_path / f"weights{suffix}").write_bytes(b"never read")
    with pytest.raises(InvalidInputError, match=f"holds pickle weights \\(weights\\{suffix}\\)"):
        io.index_model_dir(tmp_path)


def test_shards_are_planned_in_order_and_written_as_announced(tmp_path):
    specs = [io.TensorSpec(n, "F32", (s,)) for n, s in (("a", 4), ("b", 4), ("c", 16), ("d", 1))]
    assert [[s.name for s in shard] for shard in io.plan_shards(specs, 32)] == [["a", "b"], ["c"], ["d"]]
    assert [[s.name for s in shard] for shard in io.plan_shards(specs, 8)] == [["a"], ["b"], ["c"], ["d"]]
    tensors = [torch.arange(s.shape[0], dtype=torch.float32) for s in specs]
    index = io.write_sharded(tmp_path, specs, iter(tensors), 32)
    assert index["metadata"]["total_size"] == 4 * (4 + 4 + 16 + 1)
    assert json.loads((tmp_path / "model.safetensors.index.json").read_text()) == index
    for path in tmp_path.glob("*.safetensors"):
        assert struct.unpack("<Q", path.read_bytes()[:8])[0] % 8 == 0  # the data 8-byte aligned
    read = {}
    for path in tmp_path.glob("*.safetensors"):
        read.update(load_file(path))
    assert all(torch.equal(read[s.name], t) for s, t in zip(specs, tensors))
    with pytest.raises(RuntimeError, match="announced F32\\[4\\], got torch.float16\\[4\\]"):
        io.write_sharded(tmp_path, specs[:1], iter([torch.zeros(4, dtype=torch.float16)]), 32)
    with pytest.raises(RuntimeError, match="more tensors produced than announced"):
        io.write_sharded(tmp_path, specs[:1], iter([tensors[0], tensors[1]]), 32)


def test_a_reader_returns_the_first_rows_asked_for(tmp_path):
    weight = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    save_file({"w": weight}, tmp_path / "model.safetensors")
    info = io.read_header(tmp_path / "model.safetensors")["w"]
    reader = io.TensorReader()
    try:
        assert torch.equal(reader.read(info, rows=2), weight[:2])
        assert torch.equal(reader.read(info, rows=9), weight) and torch.equal(reader.read(info), weight)
    finally:
        reader.close()

"""pareto.json schema 2 renamed a layer's ``kv_heads`` to ``kv_groups`` (issue 22): a committed schema-1 file still
reads, writes back as schema 2, and both extract to the checkpoint the code before the rename wrote, tensor for
tensor (hashes recorded in tests/fixtures/pareto_schema1.tensors.json)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from nsc_prune._files import RECORD_NAME  # noqa: E402
from nsc_prune.hf.extract import ExtractOptions, extract_subnet  # noqa: E402
from nsc_prune.plan import SCHEMA_VERSION, LayerPlan, ParetoDocument  # noqa: E402

SCHEMA_1 = Path(__file__).resolve().parents[1] / "fixtures" / "pareto_schema1.json"
# sha256 of every tensor nsc-prune 0.2 (schema 1, before the rename) extracted from SCHEMA_1's points 0 and 1 of
# tiny_llama(gqa=True, lora=False), and of that base's own tensors (to tell another torch's random init apart).
SCHEMA_1_TENSORS = SCHEMA_1.with_name("pareto_schema1.tensors.json")


def tensor_hashes(folder: Path) -> dict[str, str]:
    hashes = {}
    for shard in sorted(folder.glob("*.safetensors")):
        for name, tensor in safetensors_torch.load_file(shard).items():
            hashes[name] = hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
    return hashes


def test_schema_1_reads_as_kv_groups_and_writes_schema_2(tmp_path):
    assert '"kv_heads"' in SCHEMA_1.read_text() and '"schema_version": 1' in SCHEMA_1.read_text()
    doc = ParetoDocument.read(SCHEMA_1)
    assert doc.points[1].layer_plans() == [
        LayerPlan(ffn=96, kv_groups=2),
        LayerPlan(ffn=64, kv_groups=1),
        LayerPlan(ffn=0, kv_groups=0, keep=False),
    ]
    written = json.loads(doc.write(tmp_path).read_text())
    assert written["schema_version"] == SCHEMA_VERSION == 2
    assert written["points"][1]["layers"][1] == {"ffn": 64, "kv_groups": 1}
    assert "kv_heads" not in json.dumps(written["points"])


@pytest.mark.parametrize("point", [0, 1])
def test_schema_1_and_2_extract_to_the_same_tensors(tmp_path, tiny_llama, point):
    tiny = tiny_llama(gqa=True, lora=False)
    schema_2 = ParetoDocument.read(SCHEMA_1).write(tmp_path / "v2")
    outs = []
    for name, pareto in (("v1", SCHEMA_1), ("v2", schema_2)):
        out = tmp_path / f"ckpt-{name}"
        options = ExtractOptions(dtype="float32")
        extract_subnet(pareto, tiny.base, out, point=point, options=options)
        outs.append(out)
    one, two = (tensor_hashes(out) for out in outs)
    assert one == two and len(one) > 0
    for out in outs:
        assert json.loads((out / "config.json").read_text()) == json.loads((outs[0] / "config.json").read_text())
    recorded = json.loads(SCHEMA_1_TENSORS.read_text())
    if tensor_hashes(tiny.base) != recorded["base"]:
        pytest.skip("this torch initialises the tiny base differently from the one the hashes were recorded with")
    assert one == recorded["points"][str(point)]  # what the code before the rename wrote
    plan = json.loads((outs[0] / RECORD_NAME).read_text())["plan"]
    assert all("kv_groups" in layer and "kv_heads" not in layer for layer in plan)
    kept_groups = [layer["kv_groups"] for layer in plan if layer["keep"]]
    assert kept_groups == ([1, 1] if point == 0 else [2, 1])

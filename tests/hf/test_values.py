"""nsc_prune.hf.weights.values: whole-tensor checks in slices agree with torch's own reductions."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from nsc_prune.hf.weights import values  # noqa: E402


@pytest.mark.parametrize("shape", [(), (7,), (1000, 3), (13, 17, 5)], ids=["scalar", "vector", "matrix", "3-d"])
def test_slices_agree_with_torch_whatever_the_shape(monkeypatch, shape):
    monkeypatch.setattr(values, "SLICE_ELEMENTS", 10)  # many slices, one of them partial
    tensor = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    assert values.largest_magnitude(tensor) == float(tensor.abs().max())
    assert values.all_finite(tensor)
    flat = tensor.reshape(-1)
    for bad in (math.nan, math.inf, -math.inf):
        spoilt = tensor.clone()
        spoilt.reshape(-1)[flat.numel() - 1] = bad  # in the last slice
        assert not values.all_finite(spoilt)
    spoilt.reshape(-1)[flat.numel() - 1] = math.nan
    assert math.isnan(values.largest_magnitude(spoilt))  # as torch.max: the caller's comparison is then False


def test_integer_and_empty_tensors():
    assert values.all_finite(torch.arange(5)) and values.all_finite(torch.empty(0, 4))
    assert values.largest_magnitude(torch.empty(0, 4)) == 0.0
    assert values.largest_magnitude(torch.tensor([[-3.0, 2.0]], dtype=torch.bfloat16)) == 3.0

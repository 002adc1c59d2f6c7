"""W16A16 marks (workbench.quant.w16a16): bf16 rounding, which projections they cover, and the
reference's projection with a marked weight."""

import numpy as np
import pytest

from numformats.bf16 import bf16
from workbench.config import preset
from workbench.errors import InputError
from workbench.quant.w16a16 import W16A16, round_bf16, w16a16, w16a16_names
from workbench.reference.layers import linear
from workbench.seeded import SeededWeights


def test_round_bf16_is_nearest_with_ties_to_even():
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -0.0, np.inf], np.float32)
    np.testing.assert_array_equal(round_bf16(x), np.array([1, 1 + 2 ** -6, 1 + 2 ** -7, -0.0, np.inf],
                                                          np.float32))
    assert round_bf16(x.astype(np.float64)).dtype == np.float64


def test_marks_cover_the_dense_projections_only():
    cfg = preset("tiny")
    w = SeededWeights(cfg, 0, "experts")
    names = set(w16a16_names(cfg, w))
    assert "layers.0.ffn.w1" in names and "layers.1.ffn.shared.w2" in names
    assert "layers.1.attn.wq_a" in names and "layers.1.attn.wo" in names
    assert "layers.1.attn.wkv_b" in names
    assert not {n for n in names if n.endswith(("gate", "embed", "head")) or ".experts." in n}
    m = w16a16(cfg, w)
    assert isinstance(m["layers.1.attn.wo"], W16A16) and not isinstance(m["layers.1.ffn.gate"], W16A16)
    assert "layers.1.attn.wo" in m and len(m) == len(w)


def test_a_marked_projection_rounds_its_input():
    rng = np.random.default_rng(0)
    wb = bf16(rng.standard_normal((6, 40)))
    x = rng.standard_normal((3, 40)).astype(np.float32)
    got = linear({"p": W16A16(wb)}, "p", x)
    np.testing.assert_allclose(got, round_bf16(x) @ wb.float32().T, rtol=1e-6, atol=1e-6)
    assert np.abs(got - linear({"p": wb}, "p", x)).max() > 1e-4          # W16A32 is another product


def test_marking_refuses_weights_bf16_cannot_hold():
    cfg = preset("tiny")
    w = dict(SeededWeights(cfg, 0, "fp32"))
    w["layers.0.attn.wo"] = w["layers.0.attn.wo"] + np.float32(1e-3)
    with pytest.raises(InputError, match="layers.0.attn.wo holds values bf16 cannot represent"):
        w16a16(cfg, w)["layers.0.attn.wo"]

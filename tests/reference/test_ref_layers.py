import warnings

import numpy as np
import pytest

from workbench.errors import InputError
from workbench.reference.layers import linear, rmsnorm, sigmoid, silu, swiglu


def test_rmsnorm_matches_the_formula_and_scales_after_normalising():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 12)) * 3
    w = 1 + 0.1 * rng.standard_normal(12)
    want = w * x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(rmsnorm(x, w, 1e-5), want, rtol=1e-13)
    np.testing.assert_allclose(rmsnorm(x, w, 1e-5), w * rmsnorm(x, np.ones(12), 1e-5), rtol=1e-13)
    # eps matters for small inputs
    tiny = np.full((1, 4), 1e-3)
    assert rmsnorm(tiny, np.ones(4), 1e-6)[0, 0] == pytest.approx(1e-3 / np.sqrt(1e-6 + 1e-6))


def test_rmsnorm_computes_in_the_activation_dtype():
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    w16 = np.ones(8, dtype=np.float16)
    w16.flags.writeable = False
    out = rmsnorm(x, w16, 1e-6)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, rmsnorm(x.astype(np.float64), np.ones(8), 1e-6), rtol=1e-6)


def test_sigmoid_and_silu_are_stable_at_the_extremes():
    x = np.array([-1000.0, -30.0, -1.0, 0.0, 2.0, 30.0, 1000.0])
    with warnings.catch_warnings(), np.errstate(over="raise", invalid="raise", divide="raise"):
        warnings.simplefilter("error")
        s = sigmoid(x)
        y = silu(x.astype(np.float32))
    assert s[0] == 0.0 and s[-1] == 1.0 and s[3] == 0.5
    np.testing.assert_allclose(s[1:-1], 1 / (1 + np.exp(-x[1:-1])), rtol=1e-15)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, x * s, rtol=1e-6)


def test_linear_is_x_times_w_transposed_in_the_activation_dtype():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((6, 4)).astype(np.float16)
    x = rng.standard_normal((3, 4))
    out = linear({"p": w}, "p", x)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, x @ w.astype(np.float64).T, rtol=1e-14)
    assert linear({"p": w}, "p", x.astype(np.float32)).dtype == np.float32


def test_linear_names_the_missing_tensor():
    with pytest.raises(InputError, match=r"layers\.0\.attn\.wo"):
        linear({"other": np.zeros((2, 2))}, "layers.0.attn.wo", np.zeros((1, 2)))


def _unpack_nibbles(packed):
    # docs/int4.md's packing, written out independently: column k sits in word k // 8, bits 4*(k % 8)
    n, words = packed.shape
    u = np.zeros((n, words * 8), dtype=np.int64)
    p = packed.astype(np.int64) & 0xFFFFFFFF
    for k in range(words * 8):
        u[:, k] = (p[:, k // 8] >> (4 * (k % 8))) & 0xF
    return u - 8


def test_linear_dispatches_int4_packed_weights_to_w4a16():
    from workbench.quant.int4 import pack_int4

    rng = np.random.default_rng(3)
    n, k, g = 6, 64, 32
    q = rng.integers(-7, 8, size=(n, k))
    scale = (0.01 + 0.05 * rng.random((n, k // g))).astype(np.float16)
    weights = {"layers.1.ffn.experts.0.w1.packed": pack_int4(q), "layers.1.ffn.experts.0.w1.scale": scale}
    assert (_unpack_nibbles(weights["layers.1.ffn.experts.0.w1.packed"]) == q).all()
    x = rng.standard_normal((3, k)).astype(np.float32)
    w_deq = _unpack_nibbles(weights["layers.1.ffn.experts.0.w1.packed"]) * np.repeat(
        scale.astype(np.float64), g, axis=1)
    want = x.astype(np.float16).astype(np.float64) @ w_deq.T      # fp16 activations, exact weights
    out = linear(weights, "layers.1.ffn.experts.0.w1", x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_swiglu_is_down_of_silu_gate_times_up():
    rng = np.random.default_rng(4)
    w = {"m.w1": rng.standard_normal((5, 3)), "m.w3": rng.standard_normal((5, 3)),
         "m.w2": rng.standard_normal((3, 5))}
    x = rng.standard_normal((2, 3))
    g, u = x @ w["m.w1"].T, x @ w["m.w3"].T
    want = (g / (1 + np.exp(-g)) * u) @ w["m.w2"].T
    np.testing.assert_allclose(swiglu(w, "m", x), want, rtol=1e-13)

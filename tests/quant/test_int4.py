"""INT4 logical / layout / compute layers against independent element-wise definitions."""

import numpy as np
import pytest

from workbench.bundle import BF16Array
from workbench.errors import InputError
from workbench.quant.int4 import (
    dequantize_int4,
    gen_quant4,
    int4_linear,
    pack_int4,
    quantize_int4,
    scales_to_float32,
    unpack_int4,
)


def _pack_by_hand(codes):
    """Independent packing: python ints, word += (q + 8) * 16**(k % 8)."""
    n, k = codes.shape
    out = np.zeros((n, k // 8), dtype=np.int64)
    for r in range(n):
        for c in range(k):
            out[r, c // 8] += (int(codes[r, c]) + 8) * 16 ** (c % 8)
    return out.astype(np.uint32)


def _linear_f64(x, packed, scales_f32):
    """The W4A16 definition evaluated in float64 with arithmetic nibble extraction."""
    words = packed.view(np.uint32).astype(np.int64)                            # [N, K/8]
    u = (words[..., None] // 16 ** np.arange(8)) % 16                          # [N, K/8, 8]
    q = u.reshape(packed.shape[0], -1) - 8                                     # [N, K]
    g = q.shape[1] // scales_f32.shape[1]
    w = q * np.repeat(scales_f32.astype(np.float64), g, axis=1)                # [N, K]
    return x.astype(np.float16).astype(np.float64) @ w.T


# ---- layout ----------------------------------------------------------------------------------

def test_worked_example_of_the_packing():  # docs/int4.md
    q = np.array([[1, -2, 3, 0, -7, 7, 5, -1]], dtype=np.int8)
    packed = pack_int4(q)
    assert packed.dtype == np.int32 and packed.shape == (1, 1)
    assert int(packed.view(np.uint32)[0, 0]) == 0x7DF18B69
    assert packed.astype("<i4").tobytes() == bytes([0x69, 0x8B, 0xF1, 0x7D])
    np.testing.assert_array_equal(unpack_int4(packed), q)


@pytest.mark.parametrize("shape", [(1, 8), (5, 24), (7, 256), (3, 4, 64)])
def test_pack_unpack_round_trip_exact(shape):
    rng = np.random.default_rng(sum(shape))
    codes = rng.integers(-8, 8, size=shape).astype(np.int8)
    codes.reshape(-1)[0], codes.reshape(-1)[-1] = -8, 7                        # both extremes present
    packed = pack_int4(codes)
    assert packed.dtype == np.int32 and packed.shape == (*shape[:-1], shape[-1] // 8)
    out = unpack_int4(packed)
    assert out.dtype == np.int8
    np.testing.assert_array_equal(out, codes)
    np.testing.assert_array_equal(unpack_int4(packed.view(np.uint32)), codes)


def test_pack_matches_hand_packing():
    rng = np.random.default_rng(3)
    codes = rng.integers(-8, 8, size=(6, 40))
    np.testing.assert_array_equal(pack_int4(codes).view(np.uint32), _pack_by_hand(codes))


@pytest.mark.parametrize("bad", [np.full((2, 8), 8), np.full((2, 8), -9), np.zeros((2, 12), np.int8),
                                 np.zeros((2, 8), np.float32), np.zeros((2, 0), np.int8)])
def test_pack_rejects_bad_codes(bad):
    with pytest.raises(InputError):
        pack_int4(bad)


def test_unpack_rejects_non_int32():
    with pytest.raises(InputError):
        unpack_int4(np.zeros((2, 2), np.int64))


# ---- logical ---------------------------------------------------------------------------------

@pytest.mark.parametrize("group", [32, 64, 128])
def test_quantize_round_trip_within_half_step(group):
    rng = np.random.default_rng(group)
    n, k = 9, 384
    # rows over many magnitudes, down to float16-subnormal scales
    mags = 10.0 ** rng.uniform(-9, 2, size=(n, 1))
    w = (rng.standard_normal((n, k)) * mags).astype(np.float32)
    codes, scales = quantize_int4(w, group)
    assert codes.dtype == np.int8 and codes.shape == (n, k)
    assert scales.dtype == np.float16 and scales.shape == (n, k // group)
    assert np.abs(codes).max() <= 7
    s = scales.astype(np.float32)
    # codes are optimised against the stored float16 scale, not the float32 one
    want = np.clip(np.rint(w.reshape(n, -1, group) / s[..., None]), -7, 7).reshape(n, k)
    np.testing.assert_array_equal(codes, want)
    assert np.isfinite(s).all() and (s > 0).all()
    err = np.abs(dequantize_int4(codes, scales, group) - w)
    step = np.repeat(s, group, axis=1)
    assert (err <= 0.5 * step * (1 + 1e-6)).all(), float((err / step).max())
    # in groups with a normal float16 scale: scale = float16(max|w| / 7), the largest |w| lands on +-7
    absmax = np.abs(w.reshape(n, -1, group)).max(-1)
    top = np.abs(codes.reshape(n, -1, group)).max(-1)
    normal = absmax / 7 >= np.finfo(np.float16).tiny
    assert normal.sum() >= 3 and (~normal).sum() >= 1                         # both regimes exercised
    assert (top[normal] == 7).all()
    np.testing.assert_array_equal(scales[normal], (absmax / np.float32(7))[normal].astype(np.float16))


def test_quantize_float64_input_and_stacked_experts():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 4, 64))
    codes, scales = quantize_int4(w, 32)
    assert codes.shape == (3, 4, 64) and scales.shape == (3, 4, 2)
    c0, s0 = quantize_int4(w[1].astype(np.float32), 32)
    np.testing.assert_array_equal(codes[1], c0)
    np.testing.assert_array_equal(scales[1], s0)


def test_all_zero_and_constant_groups():
    w = np.zeros((3, 64), np.float32)
    w[1, 32:] = 0.25                                                           # constant group
    w[2, :32] = -3.0
    codes, scales = quantize_int4(w, 32)
    s = scales.astype(np.float32)
    assert np.isfinite(s).all() and (s > 0).all()
    np.testing.assert_array_equal(codes[0], 0)
    np.testing.assert_array_equal(codes[1, :32], 0)
    np.testing.assert_array_equal(codes[1, 32:], 7)
    np.testing.assert_array_equal(codes[2, :32], -7)
    back = dequantize_int4(codes, scales)
    np.testing.assert_array_equal(back[0], 0)
    np.testing.assert_allclose(back[1, 32:], 0.25, rtol=1e-3)
    np.testing.assert_allclose(back[2, :32], -3.0, rtol=1e-3)


@pytest.mark.parametrize("w, group", [
    (np.zeros((2, 48), np.float32), 32),                                      # K % G != 0
    (np.zeros((2, 64), np.float32), 16),                                      # unsupported G
    (np.zeros((2, 64), np.float32), True),
    (np.zeros((2, 64), np.int32), 32),                                        # not float
    (np.zeros(64, np.float32), 32),                                           # not 2-D
    (np.full((2, 64), np.nan, np.float32), 32),
    (np.full((2, 64), 1e6, np.float32), 32),                                  # scale past float16
])
def test_quantize_rejects(w, group):
    with pytest.raises(InputError):
        quantize_int4(w, group)


def test_dequantize_group_inference_and_mismatch():
    codes, scales = quantize_int4(np.random.default_rng(1).standard_normal((4, 128)), 64)
    np.testing.assert_array_equal(dequantize_int4(codes, scales), dequantize_int4(codes, scales, 64))
    for bad_group in (32, 128):
        with pytest.raises(InputError):
            dequantize_int4(codes, scales, bad_group)
    with pytest.raises(InputError):
        dequantize_int4(codes, scales[:3])
    with pytest.raises(InputError):
        dequantize_int4(codes, -scales)


# ---- compute ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n, k, group, lead", [(1, 32, 32, (1,)), (17, 256, 32, (5,)),
                                               (8, 384, 128, (2, 3)), (33, 192, 64, ())])
def test_int4_linear_matches_float64_definition(n, k, group, lead):
    rng = np.random.default_rng(n * k)
    _, packed, scales = gen_quant4(n, k, group, seed=n + k)
    x = rng.standard_normal((*lead, k)).astype(np.float32)
    y = int4_linear(x, packed, scales)
    assert y.dtype == np.float32 and y.shape == (*lead, n)
    ref = _linear_f64(x, packed, scales.astype(np.float32))
    # float32 accumulation noise bound: K ulps of sum |x_i w_i|
    w = dequantize_int4(unpack_int4(packed), scales).astype(np.float64)
    mag = np.abs(x.astype(np.float16).astype(np.float64)) @ np.abs(w).T
    err = np.abs(y - ref)
    assert (err <= k * 2.0 ** -24 * mag + 1e-30).all()
    # the float16 rounding of x is part of the definition: skipping it is far outside that noise
    unrounded = x.astype(np.float64) @ w.T
    assert np.abs(unrounded - ref).max() > 10 * err.max()


def test_int4_linear_float64_activations():
    _, packed, scales = gen_quant4(12, 128, 32, seed=2)
    x = np.random.default_rng(2).standard_normal((3, 128))
    y = int4_linear(x, packed, scales)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, _linear_f64(x, packed, scales.astype(np.float32)), rtol=1e-12, atol=1e-14)


def test_int4_linear_bf16_scales():
    rng = np.random.default_rng(4)
    n, k = 10, 256
    codes = rng.integers(-7, 8, size=(n, k))
    packed = pack_int4(codes)
    s32 = rng.uniform(1e-3, 1e-1, size=(n, k // 32)).astype(np.float32)
    bits = (s32.view(np.uint32) >> 16).astype(np.uint16)                      # truncate to bfloat16
    s_bf16 = (bits.astype(np.uint32) << 16).view(np.float32)
    x = rng.standard_normal((4, k)).astype(np.float32)
    want = int4_linear(x, packed, s_bf16)
    np.testing.assert_array_equal(int4_linear(x, packed, bits), want)                      # uint16 bf16 bits
    np.testing.assert_array_equal(int4_linear(x, packed, BF16Array(bits)), want)
    np.testing.assert_array_equal(scales_to_float32(bits), s_bf16)
    ref = _linear_f64(x, packed, s_bf16)
    assert np.abs(want - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("args", [
    (np.zeros((2, 64), np.float32), np.zeros((4, 4), np.int32), np.ones((4, 1), np.float16)),   # K mismatch
    (np.zeros((2, 32), np.int32), np.zeros((4, 4), np.int32), np.ones((4, 1), np.float16)),     # int x
    (np.zeros((2, 32), np.float32), np.zeros((4, 4), np.int32), np.ones((3, 1), np.float16)),   # N mismatch
    (np.zeros((2, 32), np.float32), np.zeros((4, 4), np.int32), np.ones((4, 3), np.float16)),   # K % cols
    (np.zeros((2, 32), np.float32), np.zeros((4, 4), np.int32), np.ones((4, 1), np.int16)),     # scale dtype
    (np.zeros((2, 32), np.float32), np.zeros((4, 4), np.int32), np.full((4, 1), np.inf, np.float16)),
    (np.zeros((2, 32), np.float32), np.zeros((4, 4), np.int64), np.ones((4, 1), np.float16)),
])
def test_int4_linear_rejects(args):
    with pytest.raises(InputError):
        int4_linear(*args)


def test_gen_quant4_goes_through_public_path():
    w_ref, packed, scales = gen_quant4(16, 128, 64, seed=7)
    assert w_ref.dtype == np.float32 and packed.dtype == np.int32 and scales.dtype == np.float16
    assert packed.shape == (16, 16) and scales.shape == (16, 2)
    codes = unpack_int4(packed)
    assert codes.min() >= -7                                                   # nibble 0 never produced
    np.testing.assert_array_equal(w_ref, dequantize_int4(codes, scales))
    w2, p2, s2 = gen_quant4(16, 128, 64, seed=7)
    np.testing.assert_array_equal(p2, packed)
    assert not np.array_equal(gen_quant4(16, 128, 64, seed=8)[1], packed)


def test_subnormal_scale_nudged_to_keep_half_step():
    tiny = 2.0 ** -24                                                          # smallest float16 subnormal
    w = np.zeros((1, 32), np.float32)
    w[0, 0], w[0, 1] = 9.8 * tiny, 3.1 * tiny                  # max|w| / 7 = 1.4 ulp, rounds to 1 ulp
    codes, scales = quantize_int4(w, 32)
    assert scales[0, 0] == np.float16(2 * tiny)                                # nudged up one ulp
    assert codes[0, 0] == 5 and codes[0, 1] == 2                               # rint(4.9), rint(1.55)
    err = np.abs(dequantize_int4(codes, scales) - w)
    assert err.max() <= 0.5 * 2 * tiny

"""bfloat16 conversion: round to nearest even against an independent float64 reference."""

import numpy as np

from numformats.bf16 import BF16Array, bf16, exact_bf16, round_bf16


def _reference_bits(x: np.ndarray) -> np.ndarray:
    """Nearest bfloat16 by comparing the two neighbours in float64; ties to the even one."""
    u = x.astype(np.float32).view(np.uint32).astype(np.int64)
    lo = u & 0xFFFF0000                                    # truncation toward zero
    hi = lo + 0x10000                                      # next bfloat16 away from zero
    f = lambda b: b.astype(np.uint32).view(np.float32).astype(np.float64)  # noqa: E731
    x64 = x.astype(np.float32).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        d_lo, d_hi = np.abs(x64 - f(lo)), np.abs(f(hi) - x64)
    hi_is_inf = (hi & 0x7FFFFFFF) == 0x7F800000
    # rounding to inf happens when x is at least halfway to 2^128 (the next "power" past max)
    d_hi = np.where(hi_is_inf, np.abs(2.0**128 - np.abs(x64)), d_hi)
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & ((lo >> 16) & 1 == 1))
    return (np.where(pick_hi, hi, lo) >> 16).astype(np.uint16)


def test_rne_matches_reference_on_random_and_special_values():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 2**16, 2000, dtype=np.uint32) << 16) | np.uint32(0x8000)
    special = np.array([0, 0x80000000, 1, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF,
                        0x7F800000, 0xFF800000, 0x00008000, 0x00018000, 0x3F808000, 0x3F818000], np.uint32)
    x = np.concatenate([bits, ties, special]).view(np.float32)
    x = x[~np.isnan(x)]
    got = bf16(x).bits
    np.testing.assert_array_equal(got, _reference_bits(x))


def test_nan_inf_zero_and_shape():
    x = np.array([[np.nan, -np.nan, np.inf], [-np.inf, -0.0, 3.4e38]], dtype=np.float32)
    b = bf16(x)
    assert isinstance(b, BF16Array) and b.shape == (2, 3) and b.bits.dtype == np.uint16
    w = b.float32()
    assert np.isnan(w[0, 0]) and np.isnan(w[0, 1]) and np.signbit(w[0, 1])
    assert w[0, 2] == np.inf and w[1, 0] == -np.inf and w[1, 2] == np.inf
    assert w[1, 1] == 0 and np.signbit(w[1, 1])
    assert bf16(b) is b


def test_every_bf16_pattern_widens_and_narrows_back():
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    wide = BF16Array(bits).float32()
    back = bf16(wide).bits
    nan = np.isnan(wide)
    np.testing.assert_array_equal(back[~nan], bits[~nan])
    assert np.isnan(BF16Array(back[nan]).float32()).all()
    np.testing.assert_array_equal(np.asarray(BF16Array(bits)).view(np.uint32), bits.astype(np.uint32) << 16)


def test_round_bf16_keeps_shape_and_dtype_and_equals_the_widened_bits():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((7, 9)).astype(np.float32)[:, ::2] * np.float32(1e3)      # strided
    r = round_bf16(x)
    assert r.shape == x.shape and r.dtype == np.float32
    np.testing.assert_array_equal(r.view(np.uint32) >> 16, _reference_bits(x))
    assert not (r.view(np.uint32) & 0xFFFF).any()
    d = round_bf16(np.float64(1.00390625) * np.ones(()))                               # 0-d float64: a tie
    assert d.shape == () and d.dtype == np.float64 and d == 1.0
    assert np.isnan(round_bf16(np.array([np.nan], np.float32))).all()


def test_exact_bf16_takes_bf16_values_only():
    bits = np.arange(0, 2**16, 7, dtype=np.uint32).astype(np.uint16)[:9360].reshape(-1, 13)
    wide = BF16Array(bits).float32()
    np.testing.assert_array_equal(exact_bf16(wide).bits, bits)              # NaNs and infs among them
    off = wide.copy()
    off.view(np.uint32)[3, 5] |= 1                                          # one low bit set
    assert exact_bf16(off) is None
    b = BF16Array(bits)
    assert exact_bf16(b) is b

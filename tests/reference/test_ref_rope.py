import math

import numpy as np
import pytest

from workbench.config import preset
from workbench.reference.rope import (
    apply_rope,
    rope_attention_factor,
    rope_cos_sin,
    yarn_correction_range,
    yarn_inv_freq,
)

K2 = preset("k2")


@pytest.mark.parametrize("changes, want", [
    ({}, (19, 20)),                                                  # K2 / K2-Thinking
    ({"beta_fast": 32.0}, (8, 20)),                                  # K2.5 / K2.6
    ({"rope_theta": 10000.0, "beta_fast": 32.0}, (10, 23)),          # DeepSeek-V3
])
def test_yarn_correction_range_matches_docs_model(changes, want):
    assert yarn_correction_range(K2.replace(**changes)) == want


@pytest.mark.parametrize("changes, want", [
    ({}, 0.130861), ({"rope_factor": 64.0}, 0.144680), ({"rope_factor": 40.0}, 0.135234),
    ({"rope_scaling_type": None}, 0.072169),
])
def test_softmax_scale_uses_qk_head_dim_192_and_mscale_squared(changes, want):
    assert K2.replace(**changes).softmax_scale == pytest.approx(want, abs=1e-6)


def test_k2_yarn_is_a_hard_cut_at_pair_20():
    base = 50000.0 ** (-np.arange(0, 64, 2) / 64)
    f = yarn_inv_freq(K2)
    assert f.dtype == np.float64 and f.shape == (32,)
    np.testing.assert_allclose(f[:20], base[:20], rtol=1e-15)      # ramp 0 up to pair low = 19
    np.testing.assert_allclose(f[20:], base[20:] / 32, rtol=1e-15)  # ramp 1 from pair high = 20


def test_deepseek_v3_yarn_blends_linearly_between_low_and_high():
    cfg = K2.replace(rope_theta=10000.0, beta_fast=32.0, rope_factor=40.0)
    base = 10000.0 ** (-np.arange(0, 64, 2) / 64)
    ramp = np.clip((np.arange(32) - 10) / 13, 0, 1)
    np.testing.assert_allclose(yarn_inv_freq(cfg), base * (1 - ramp) + base / 40 * ramp, rtol=1e-15)
    assert 0 < ramp[15] < 1


def test_equal_low_and_high_take_the_0001_guard():
    # betas straddling the value whose correction dim is exactly 19: floor(19.00..) == ceil(18.99..)
    b = 4096 / (2 * math.pi) / math.exp(19 * 2 * math.log(50000.0) / 64)
    cfg = K2.replace(beta_fast=b * (1 - 1e-6), beta_slow=b * (1 + 1e-6))
    assert yarn_correction_range(cfg) == (19, 19)
    with np.errstate(all="raise"):
        f = yarn_inv_freq(cfg)
    base = 50000.0 ** (-np.arange(0, 64, 2) / 64)
    np.testing.assert_allclose(f[:20], base[:20], rtol=1e-15)
    np.testing.assert_allclose(f[20:], base[20:] / 32, rtol=1e-15)


def test_without_scaling_the_frequencies_are_plain_and_cos_sin_unscaled():
    cfg = K2.replace(rope_scaling_type=None)
    np.testing.assert_allclose(yarn_inv_freq(cfg), 50000.0 ** (-np.arange(0, 64, 2) / 64), rtol=1e-15)
    assert rope_attention_factor(cfg) == 1.0


def test_cos_sin_carry_the_mscale_ratio():
    cfg = K2.replace(mscale=1.0, mscale_all_dim=0.5)
    m = (0.1 * math.log(32) + 1) / (0.05 * math.log(32) + 1)
    assert rope_attention_factor(cfg) == pytest.approx(m)
    cos, sin = rope_cos_sin(cfg, np.array([0, 7, 4000]))
    np.testing.assert_allclose(cos ** 2 + sin ** 2, m * m, rtol=1e-14)
    assert rope_attention_factor(K2) == 1.0


def test_apply_rope_rotates_interleaved_pairs_as_complex_numbers():
    rng = np.random.default_rng(0)
    cfg = K2.replace(qk_rope_head_dim=16)
    pos = np.array([0, 3, 5000, 131071])
    x = rng.standard_normal((2, 4, 16))                          # [heads, S, R]
    cos, sin = rope_cos_sin(cfg, pos)
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * pos[:, None] * yarn_inv_freq(cfg))
    y = apply_rope(x, cos, sin)
    np.testing.assert_allclose(y[..., 0::2], z.real, atol=1e-12)
    np.testing.assert_allclose(y[..., 1::2], z.imag, atol=1e-12)
    assert apply_rope(x.astype(np.float32), cos, sin).dtype == np.float32


def test_rope_scores_depend_only_on_the_relative_position():
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal(64), rng.standard_normal(64)

    def score(m, n):
        cos, sin = rope_cos_sin(K2, np.array([m, n]))
        qr = apply_rope(q[None], cos[:1], sin[:1])[0]
        kr = apply_rope(k[None], cos[1:], sin[1:])[0]
        return qr @ kr

    assert score(10, 3) == pytest.approx(score(1007, 1000), rel=1e-9)
    assert score(10, 3) != pytest.approx(score(10, 4), rel=1e-3)

import numpy as np
import pytest

from workbench.errors import InputError
from workbench.reference.mla import mla_absorbed, mla_naive
from workbench.reference.model import LatentCache
from workbench.reference.rope import yarn_inv_freq
from workbench.weights import random_weights


def _brute_force(cfg, w, layer, x_all, pos_all):
    """docs/model.md's naive MLA written out per head and per key, causal, with explicit complex rotation."""
    p = f"layers.{layer}.attn."
    n, r, c, h = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank, cfg.num_attention_heads

    def norm(v, g):
        return g * v / np.sqrt(np.mean(v * v) + cfg.mla_norm_eps)

    lf = np.log(cfg.rope_factor)
    m = (0.1 * cfg.mscale * lf + 1) / (0.1 * cfg.mscale_all_dim * lf + 1)   # YaRN factor on cos/sin

    def rot(v, p_):
        z = (v[0::2] + 1j * v[1::2]) * np.exp(1j * p_ * yarn_inv_freq(cfg)) * m
        out = np.empty(r)
        out[0::2], out[1::2] = z.real, z.imag
        return out

    outs = []
    for t, (x, pt) in enumerate(zip(x_all, pos_all, strict=True)):
        if cfg.q_lora_rank is None:
            q = w[p + "wq"] @ x
        else:
            q = w[p + "wq_b"] @ norm(w[p + "wq_a"] @ x, w[p + "q_norm"])
        q = q.reshape(h, n + r)
        o = []
        for head in range(h):
            qh = np.concatenate([q[head, :n], rot(q[head, n:], pt)])
            scores, values = [], []
            for t2 in range(t + 1):
                a = w[p + "wkv_a"] @ x_all[t2]
                ckv = norm(a[:c], w[p + "kv_norm"])
                kv = (w[p + "wkv_b"] @ ckv).reshape(h, n + cfg.v_head_dim)
                kh = np.concatenate([kv[head, :n], rot(a[c:], pos_all[t2])])
                scores.append(qh @ kh * cfg.softmax_scale)
                values.append(kv[head, n:])
            pr = np.exp(np.array(scores) - max(scores))
            o.append((pr / pr.sum()) @ np.array(values))
        outs.append(w[p + "wo"] @ np.concatenate(o))
    return np.array(outs)


@pytest.mark.parametrize("q_lora", [24, None])
@pytest.mark.parametrize("attn", [mla_naive, mla_absorbed])
def test_mla_matches_a_per_head_brute_force(make_cfg, q_lora, attn):
    cfg = make_cfg(q_lora_rank=q_lora, mscale_all_dim=0.7)      # cos/sin factor != 1 too
    w = random_weights(cfg, 1, np.float64)
    x = np.random.default_rng(2).standard_normal((5, cfg.hidden_size))
    pos = np.array([0, 1, 2, 3, 4]) + 900
    cache = LatentCache.empty(cfg, 8, np.float64)
    got = attn(cfg, w, 1, x, pos, cache)
    np.testing.assert_allclose(got, _brute_force(cfg, w, 1, x, pos), rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("q_lora", [24, None])
def test_naive_and_absorbed_agree_with_a_cached_prefix_and_a_tree_mask(make_cfg, q_lora):
    cfg = make_cfg(q_lora_rank=q_lora)
    w = random_weights(cfg, 3, np.float64)
    rng = np.random.default_rng(4)
    x1, x2 = rng.standard_normal((4, cfg.hidden_size)), rng.standard_normal((5, cfg.hidden_size))
    vis = np.eye(5, dtype=bool)
    vis[1:, 0] = True
    vis[3, 1] = vis[4, 2] = True                                # root 0; children 1, 2; 3 under 1, 4 under 2
    outs, caches = [], []
    for attn in (mla_naive, mla_absorbed):
        cache = LatentCache.empty(cfg, 12, np.float64)
        a = attn(cfg, w, 0, x1, np.arange(4), cache)
        assert cache.length == 0                               # mla never advances the length
        cache.length = 4
        b = attn(cfg, w, 0, x2, np.array([4, 5, 5, 6, 6]), cache, visibility=vis)
        outs.append((a, b))
        caches.append(cache)
    for got, want in zip(outs[1], outs[0], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(caches[0].layers[0], caches[1].layers[0])
    assert not caches[0].layers[0][9:].any() and not caches[0].layers[1].any()   # only 9 rows of layer 0


def test_causal_rows_ignore_later_inputs(make_cfg):
    cfg = make_cfg()
    w = random_weights(cfg, 5, np.float64)
    x = np.random.default_rng(6).standard_normal((4, cfg.hidden_size))
    y = x.copy()
    y[2:] += 1.0
    a = mla_naive(cfg, w, 0, x, np.arange(4), LatentCache.empty(cfg, 4, np.float64))
    b = mla_naive(cfg, w, 0, y, np.arange(4), LatentCache.empty(cfg, 4, np.float64))
    np.testing.assert_array_equal(a[:2], b[:2])
    assert not np.allclose(a[2:], b[2:])


def test_bad_visibility_and_full_cache_are_input_errors(make_cfg):
    cfg = make_cfg()
    w = random_weights(cfg, 0)
    x = np.zeros((3, cfg.hidden_size), dtype=np.float32)
    cache = LatentCache.empty(cfg, 4)
    with pytest.raises(InputError, match="bool"):
        mla_absorbed(cfg, w, 0, x, np.arange(3), cache, visibility=np.eye(3))
    with pytest.raises(InputError, match="bool"):
        mla_absorbed(cfg, w, 0, x, np.arange(3), cache, visibility=np.eye(2, dtype=bool))
    with pytest.raises(InputError, match="itself"):
        mla_naive(cfg, w, 0, x, np.arange(3), cache, visibility=np.zeros((3, 3), dtype=bool))
    cache.length = 2
    with pytest.raises(InputError, match="full"):
        mla_naive(cfg, w, 0, x, np.arange(3), cache)

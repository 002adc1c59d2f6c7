"""MLA prep + absorbed attention kernels against workbench.reference.mla.mla_absorbed: new rows on top
of a filled latent cache, causal (prefill) and a tree visibility (DDTree verify), q_lora on and off."""

import numpy as np
import pytest

from kernels_numba.blockops import TPB
from kernels_numba.device import download, kernel_array, to_device, zeros
from kernels_numba.linear import linear
from kernels_numba.mla import make_mla_attention
from kernels_numba.ops import mla_prep
from kernels_numba.sim import sim_speed
from numformats.bf16 import BF16Array, bf16
from workbench.config import preset
from workbench.reference.layers import rmsnorm
from workbench.reference.mla import mla_absorbed
from workbench.reference.model import LatentCache
from workbench.reference.rope import rope_tables
from workbench.weights import random_weights


@pytest.mark.parametrize("q_lora,tree,ks", [(True, False, 1), (True, True, 3), (False, True, 1)])
def test_mla_kernels_match_reference(q_lora, tree, ks):
    """ks > 1 simulates the K-sliced launch the GPU uses (blockops.KS)."""
    cfg = preset("tiny") if q_lora else preset("tiny").replace(q_lora_rank=None)
    w = random_weights(cfg, 3)
    rng = np.random.default_rng(4)
    p_len, s, layer = 4, 3, 1
    cache = LatentCache.empty(cfg, 12)
    x_old = rng.standard_normal((p_len, cfg.hidden_size)).astype(np.float32)
    mla_absorbed(cfg, w, layer, x_old, np.arange(p_len), cache)            # fill rows [0, P)
    cache.length = p_len
    dev_cache = to_device(cache.layers[layer])
    x = rng.standard_normal((s, cfg.hidden_size)).astype(np.float32)
    x = rmsnorm(x, w[f"layers.{layer}.attn_norm"], 1e-6)
    depth = np.array([0, 1, 1] if tree else [0, 1, 2], np.int32)
    vis = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]] if tree else np.tril(np.ones((3, 3))), np.uint8)
    want = mla_absorbed(cfg, w, layer, x, p_len + depth.astype(np.int64), cache, vis.astype(bool))
    a = f"layers.{layer}.attn."
    first = w[a + "wq_a"] if q_lora else w[a + "wq"]
    a1t = np.concatenate([first, w[a + "wkv_a"]]).T
    meta = to_device(np.array([p_len, s, 0, 0, 0, 0, 0, 0], np.int32))
    cos, sin = (to_device(t) for t in rope_tables(cfg, 12))
    d_x, d_a1 = to_device(x), zeros((s, a1t.shape[1]))
    linear(d_a1, d_x, to_device(a1t), meta, s, ks=ks)
    q_rank = cfg.q_lora_rank or 0
    d_qn = zeros((s, max(q_rank, 1)))
    q_norm = w[a + "q_norm"] if q_lora else np.zeros(1, np.float32)
    d_depth, d_vis = to_device(depth), to_device(vis)
    mla_prep(d_qn, dev_cache, d_a1, to_device(q_norm), to_device(w[a + "kv_norm"]), cos, sin, d_depth, meta,
             q_rank, cfg.kv_lora_rank, 1e-6, s, ks=ks)
    q = d_a1
    if q_lora:
        q = zeros((s, cfg.num_attention_heads * cfg.qk_head_dim))
        linear(q, d_qn, to_device(w[a + "wq_b"].T), meta, s)
    o = zeros((s, cfg.num_attention_heads * cfg.v_head_dim))
    attn = make_mla_attention(cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim,
                              cfg.qk_nope_head_dim, cfg.v_head_dim, 12, ks)
    attn[(s, cfg.num_attention_heads), (TPB, ks), 0](o, q, dev_cache, to_device(w[a + "wkv_b"]), cos, sin,
                                                      d_depth, d_vis,
                                                 meta, np.float32(cfg.softmax_scale))
    out = zeros((s, cfg.hidden_size))
    linear(out, o, to_device(w[a + "wo"].T), meta, s)
    rows = p_len + s
    np.testing.assert_allclose(download(dev_cache)[:rows], cache.layers[layer][:rows], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(download(out), want, rtol=1e-4, atol=1e-5)


def _core(scores: np.ndarray, cache16: np.ndarray, depth, vis, start: int, live: int, scale: float,
          c: int, hg: int) -> np.ndarray:
    """mla_core_bf16 on [H, T, S] scores and a bf16 cache [S, C+R] (uint16 bits): ctx bits [H, T, C]."""
    from kernels_numba.mla import CORE_CHUNKS, mla_core_bf16
    h, t, _ = scores.shape
    ctx = zeros((h, t, c), np.int16)
    meta = to_device(np.array([start, live, 0, 0, 0, 0, 0, 0], np.int32))
    cache = kernel_array(to_device(cache16.view(np.int16).view(np.int32)))
    part, stats = zeros((CORE_CHUNKS, h, t, c)), zeros((h, t, 2))
    with sim_speed():
        mla_core_bf16(kernel_array(ctx), kernel_array(to_device(scores.astype(np.float32))), cache,
                      to_device(np.asarray(depth, np.int32)), to_device(np.asarray(vis, np.uint8)), meta,
                      scale, kernel_array(part), kernel_array(stats), hg=hg)
    return download(ctx).view(np.uint16)


def _tree_case(seed: int):
    """Cached rows, then a tree whose depth-1 path node (slot 2) follows its sibling (slot 1), and its
    child (slot 4) follows its own sibling (slot 3)."""
    rng = np.random.default_rng(seed)
    h, c, r, start = 4, 96, 16, 37                             # 96: a column group only half full
    parents = [-1, 0, 0, 2, 2]
    depth = np.array([0, 1, 1, 2, 2], np.int32)
    vis = np.eye(5, dtype=np.uint8)
    for i, par in enumerate(parents):
        while par >= 0:
            vis[i, par] = 1
            par = parents[par]
    s = start + 5 + 6                                          # rows past the tree: never seen
    cache = bf16(rng.standard_normal((s, c + r)).astype(np.float32)).bits
    scores = rng.standard_normal((h, 5, s)).astype(np.float32) * 3
    return h, c, start, depth, vis, cache, scores


def test_mla_core_bf16_is_the_masked_softmax_times_the_latents():
    """Against the definition in float64: p = bf16(softmax of scale * scores over the row's ancestors and
    the cache), ctx = bf16(p @ c_kv); one live row fewer than the grid's, which reads zeros."""
    h, c, start, depth, vis, cache, scores = _tree_case(0)
    scale = 0.3
    got = BF16Array(_core(scores, cache, depth, vis, start, 4, scale, c, 2)).float32()
    kv = BF16Array(cache).float32()[:, :c].astype(np.float64)
    for i in range(4):
        keys = np.concatenate([np.arange(start), start + np.flatnonzero(vis[i])])
        z = scores[:, i, keys].astype(np.float64) * np.float32(scale)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p = bf16((p / p.sum(axis=1, keepdims=True)).astype(np.float32)).float32().astype(np.float64)
        np.testing.assert_allclose(got[:, i], p @ kv[keys], rtol=1e-2, atol=1e-3)
    assert (got[:, 4] == 0).all()


@pytest.mark.parametrize("hg", [1, 4])
def test_mla_core_bf16_tree_rows_equal_decode_rows_bit_for_bit(hg):
    """Each tree row, whatever slots its ancestors and their siblings took, equals the one-row decode of
    the same token at the same position (its ancestors' rows moved into the cache after the context),
    bit for bit: the core sums every key at its position in the sequence."""
    h, c, start, depth, vis, cache, scores = _tree_case(1)
    tree = _core(scores, cache, depth, vis, start, 5, 0.25, c, hg)
    for i in range(5):
        slots = np.flatnonzero(vis[i])                        # ancestors-or-self by depth (slot order)
        keys = np.concatenate([np.arange(start), start + slots])
        d_start = start + depth[i]
        s = scores.shape[2]
        cache_d = np.zeros_like(cache)
        cache_d[:len(keys)] = cache[keys]
        scores_d = np.zeros((h, 1, s), np.float32)
        scores_d[:, 0, :len(keys)] = scores[:, i, keys]
        one = _core(scores_d, cache_d, [0], [[1]], d_start, 1, 0.25, c, 1)
        np.testing.assert_array_equal(tree[:, i], one[:, 0], err_msg=f"row {i} (slot {slots[-1]})")


def test_mla_core_heads_per_block_keep_shared_memory_within_a_block():
    from kernels_numba._validate import KernelInputError
    from kernels_numba.mla import CORE_CHUNKS, core_heads_per_block
    kc = 384                                                  # keys of a chunk at 16 heads: 24 KB
    assert [core_heads_per_block(64, CORE_CHUNKS * k) for k in (kc, kc + 1, 2 * kc + 1, 16 * kc)] == \
        [16, 8, 4, 1]
    assert core_heads_per_block(6, 100) == 2
    with pytest.raises(KernelInputError, match=f"at most {CORE_CHUNKS * 6144} keys"):
        core_heads_per_block(64, CORE_CHUNKS * 6144 + 1)


def test_mla_core_wrapper_refuses_mismatched_buffers_in_one_line():
    from kernels_numba._validate import KernelInputError
    from kernels_numba.mla import CORE_CHUNKS, mla_core_bf16
    ctx, scores = kernel_array(zeros((4, 2, 64), np.int16)), kernel_array(zeros((4, 2, 16)))
    depth, vis, meta = zeros(2, np.int32), zeros((2, 2), np.uint8), zeros(8, np.int32)
    part, stats = kernel_array(zeros((CORE_CHUNKS, 4, 2, 64))), kernel_array(zeros((4, 2, 2)))
    for cache, match in ((zeros((16, 20), np.int32), "must be even and within the cache's 40 columns"),
                         (zeros((8, 40), np.int32), r"cache: shape \(8, 40\)"),
                         (zeros((16, 40), np.float32), "cache: dtype float32")):
        with pytest.raises(KernelInputError, match=match):
            mla_core_bf16(ctx, scores, kernel_array(cache), depth, vis, meta, 0.1, part, stats)
    cache = kernel_array(zeros((16, 40), np.int32))
    with pytest.raises(KernelInputError, match="scores: shape"):
        mla_core_bf16(ctx, kernel_array(zeros((4, 3, 16))), cache, depth, vis, meta, 0.1, part, stats)
    with pytest.raises(KernelInputError, match="part: shape"):
        mla_core_bf16(ctx, scores, cache, depth, vis, meta, 0.1, kernel_array(zeros((4, 2, 64))), stats)


@pytest.mark.parametrize("s8", [40, 1100])
def test_softmax16_is_the_masked_softmax_in_bf16(s8):
    """``mla.softmax16``: bf16 of softmax(scale * scores) over the visible keys, hidden keys 0, a row
    with every key hidden all 0; 1,100 keys take 3 warps of 12 keys a thread under the simulator (the
    max meets across warps), 40 one warp of 2."""
    from kernels_numba.mla import softmax16
    rng = np.random.default_rng(s8)
    t, h, scale = 3, 2, 0.125
    scores = (rng.standard_normal((t * h, s8)) * 8).astype(np.float32)
    hidden = (rng.random((t, s8)) < 0.3).astype(np.uint8)
    hidden[2] = 1                                                    # a padding row: every key hidden
    p16 = to_device(np.full((t * h, s8), 7, np.int16))
    with sim_speed():
        softmax16(p16, to_device(scores), to_device(hidden), h, scale, t)
    got = BF16Array(download(p16).view(np.uint16)).float32()
    z = np.where(np.repeat(hidden, h, 0) == 1, -np.inf, scores.astype(np.float64) * scale)
    with np.errstate(invalid="ignore"):
        want = np.exp(z - z.max(1, keepdims=True))
        want = np.nan_to_num(want / want.sum(1, keepdims=True))
    np.testing.assert_allclose(got, want, rtol=2 ** -8, atol=1e-30)
    assert (got[np.repeat(hidden, h, 0) == 1] == 0).all() and (got[4:] == 0).all()

"""MLA prep + absorbed attention kernels against workbench.reference.mla.mla_absorbed: new rows on top
of a filled latent cache, causal (prefill) and a tree visibility (DDTree verify), q_lora on and off."""

import numpy as np
import pytest

from kernels_numba.blockops import TPB
from kernels_numba.device import download, to_device, zeros
from kernels_numba.linear import linear
from kernels_numba.mla import make_mla_attention, mla_prep_kernel
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
    mla_prep_kernel[s, (TPB, ks), 0](d_qn, dev_cache, d_a1, to_device(q_norm), to_device(w[a + "kv_norm"]),
                                     cos, sin, d_depth, meta, np.int32(q_rank), np.int32(cfg.kv_lora_rank),
                                     np.float32(1e-6))
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

"""One target forward on the device: the launch sequence over ``rows`` grid rows (meta[1] live).

Mirrors ``workbench.reference.model.forward`` op for op: embed, per layer [attn_norm, fused q_a/kv_a
projection, MLA prep (norms, rope, cache write), wq_b, absorbed attention, wo + residual, ffn_norm,
router + routed experts + shared experts (or the dense MLP) + residual], final norm, head, argmax.
The same sequence is launched eagerly (prefill) or inside a CUDA graph capture (decode, verify).
"""

from __future__ import annotations

import numpy as np

from kernels_numba import ffn
from kernels_numba.blockops import KS, TPB
from kernels_numba.linear import linear
from kernels_numba.mla import make_mla_attention, mla_prep_kernel
from kernels_numba.rmsnorm import rmsnorm_kernel
from kernels_numba.router import make_route
from kernels_numba.tokens import argmax_kernel, copy_rows_kernel, embed_kernel


def launch_forward(eng, rows: int, stream, taps: tuple[int, ...] = ()) -> None:
    """Launch the forward of ``eng`` (a runtime.Engine) for ``rows`` grid rows on ``stream``.

    Reads ids/depth/vis/meta from the engine's buffers, appends latent rows at meta[0] + i,
    leaves logits [rows, Vo] and argmax [rows]; copies the outputs of layers ``taps`` into feats.
    """
    m, b, cfg = eng.model, eng.buf, eng.cfg
    s = stream
    eps = np.float32(cfg.rms_norm_eps)
    mla_eps = np.float32(cfg.mla_norm_eps)
    q_rank = np.int32(cfg.q_lora_rank or 0)
    c_rank = np.int32(cfg.kv_lora_rank)
    scale = np.float32(cfg.softmax_scale)
    attn = make_mla_attention(cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim,
                              cfg.qk_nope_head_dim, cfg.v_head_dim, b.max_len)
    route = make_route(cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group,
                       cfg.norm_topk_prob, cfg.routed_scaling_factor)
    embed_kernel[rows, TPB, s](b.h, m.embed, b.ids, b.meta)
    for i, lay in enumerate(m.layers):
        cache = eng.cache_views[i]
        rmsnorm_kernel[rows, TPB, s](b.x, b.h, lay.attn_norm, eps, b.meta)
        linear(b.a1, b.x, lay.a1t, b.meta, rows, stream=s)
        mla_prep_kernel[rows, TPB, s](b.qn, cache, b.a1, lay.q_norm, lay.kv_norm, eng.cos, eng.sin, b.depth,
                                      b.meta, q_rank, c_rank, mla_eps)
        q = b.a1
        if lay.wq_bt is not None:
            linear(b.q, b.qn, lay.wq_bt, b.meta, rows, stream=s)
            q = b.q
        attn[(rows, cfg.num_attention_heads), (TPB, KS), s](b.o, q, cache, lay.wkv_b, eng.cos, eng.sin,
                                                             b.depth,
                                                      b.vis, b.meta, scale)
        linear(b.h, b.o, lay.wot, b.meta, rows, accumulate=True, stream=s)
        rmsnorm_kernel[rows, TPB, s](b.x, b.h, lay.ffn_norm, eps, b.meta)
        if lay.moe:
            route[rows, (TPB, KS), s](b.rids, b.rwts, b.x, lay.gate_t, lay.gate_bias, b.meta)
            ffn.up(b.hid, b.x, b.rids, lay.experts, b.meta, rows, stream=s)
            ffn.down(b.h, b.hid, b.rids, b.rwts, lay.experts, b.meta, rows, stream=s)
        if lay.mlp:
            ffn.up(b.hid_sh, b.x, b.zeros, lay.mlp, b.meta, rows, stream=s)
            ffn.down(b.h, b.hid_sh, b.zeros, b.ones, lay.mlp, b.meta, rows, stream=s)
        if i in taps:
            copy_rows_kernel[rows, TPB, s](eng.feat_views[taps.index(i)], b.h, b.meta)
    rmsnorm_kernel[rows, TPB, s](b.x, b.h, m.norm, eps, b.meta)
    linear(b.logits, b.x, m.headt, b.meta, rows, stream=s)
    argmax_kernel[rows, TPB, s](b.amax, b.logits, b.meta)

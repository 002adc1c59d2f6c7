"""One target forward on the device: the ops sequence over ``rows`` grid rows (meta[1] live).

Mirrors ``workbench.reference.model.forward`` op for op: embed, per layer [attn_norm, the absorbed MLA
(fused q_a/kv_a projection, attn_norm inside it where ops folds it; norms + rope + cache write, wq_b,
attention, wo + residual), ffn_norm, the MoE block (router, routed and shared experts) or the dense
MLP, + residual], final norm, head, argmax.
A layer's ``moe_block`` (set when its experts were not uploaded) runs in place of ``ops.moe``: the
expert-parallel stack (``workbench.parallel.ep_stack``) puts its all-to-all block there.
Every op is ``kernels_numba.ops`` (fast kernels where the weights allow, portable ones otherwise); the
same sequence is launched eagerly (prefill) or inside a CUDA graph capture (decode, verify).
"""

from __future__ import annotations

from kernels_numba import ops


def launch_forward(eng, rows: int, stream, taps: tuple[int, ...] = (), after_layer=None) -> None:
    """Launch the forward of ``eng`` (a runtime.Engine) for ``rows`` grid rows on ``stream``.

    Reads ids/depth/vis/meta from the engine's buffers, appends latent rows at meta[0] + i,
    leaves logits [rows, Vo] and argmax [rows]; copies the outputs of layers ``taps`` into feats.
    ``after_layer(i)``, if given, runs on the host after layer i is launched (eager diagnostics).
    """
    m, b, cfg, s = eng.model, eng.buf, eng.cfg, stream
    eps = cfg.rms_norm_eps
    ops.embed(b.h, m.embed, b.ids, b.meta, rows, s)
    step_rows(eng, rows, s)                                                   # shared by every layer
    for i, lay in enumerate(m.layers):
        launch_layer(eng, lay, eng.cache_views[i], rows, s)
        if after_layer is not None:
            after_layer(i)
        if i in taps:
            ops.copy_rows(eng.feat_views[taps.index(i)], b.h, b.meta, rows, s)
    ops.rmsnorm(b.x, b.h, m.norm, eps, b.meta, rows, s)
    ops.linear(b.logits, b.x, m.head, b.meta, rows, s)
    ops.argmax(b.amax, b.logits, b.meta, rows, s)


def step_rows(eng, rows: int, s) -> None:
    """What a step computes once for all its layers: the BLAS attention cores' rope rows and key mask
    (``ops.attention_rows``; nothing when no layer's attention is on the BLAS path)."""
    b = eng.buf
    ops.attention_rows(b.att, eng.cos, eng.sin, b.depth, b.vis, b.meta, rows, s)


def launch_layer(eng, lay, cache, rows: int, s) -> None:
    """One decoder layer on the residual rows h [rows, D] in place (``reference.model.decoder_layer``)."""
    b, eps = eng.buf, eng.cfg.rms_norm_eps
    mla(eng, lay, cache, rows, s)                                             # h += attention(attn_norm(h))
    ops.rmsnorm(b.x, b.h, lay.ffn_norm, eps, b.meta, rows, s)
    if lay.moe is not None:
        ops.moe(b.h, b.x, lay.moe, eng.scratch, b.meta, rows, s)              # h += moe(x)
    elif lay.moe_block is not None:
        lay.moe_block(b.h, b.x, rows, s)                                      # h += moe(x), elsewhere
    else:
        ops.swiglu(b.h, b.x, lay.mlp, eng.scratch, b.meta, rows, s)           # h += dense_mlp(x)


def mla(eng, lay, cache, rows: int, s) -> None:
    """h += wo(attention) of attn_norm(h) (``workbench.reference.mla.mla_absorbed``); the norm inside the
    fused q_a / kv_a projection where ops folds it (``ops.norm_linear``)."""
    b, cfg = eng.buf, eng.cfg
    eps = cfg.rms_norm_eps
    ops.norm_linear(b.a1, b.h, lay.attn_norm, eps, lay.a1, b.x, b.meta, rows, s)   # [c_q || c_kv || k_pe]
    ops.mla_prep(b.qn, cache, b.a1, lay.q_norm, lay.kv_norm, eng.cos, eng.sin, b.depth, b.meta,
                 cfg.q_lora_rank or 0, cfg.kv_lora_rank, cfg.mla_norm_eps, rows, s)
    q = b.a1
    if lay.wq_b is not None:
        ops.linear(b.q, b.qn, lay.wq_b, b.meta, rows, s)
        q = b.q
    ops.mla_attention(b.o, q, cache, lay.attn, eng.cos, eng.sin, b.depth, b.vis, b.meta, cfg.softmax_scale,
                      cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim,
                      cfg.v_head_dim, b.max_len, rows, s, att=b.att)
    ops.linear(b.h, b.o, lay.wo, b.meta, rows, s, accumulate=True)

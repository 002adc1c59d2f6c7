"""The BLAS path of the FP32 ops (kernels_numba/blas.py: torch over the engine's buffers, cuBLAS on a
GPU, torch's CPU BLAS here) against the portable kernels on fresh random inputs, and which FP32 weights
take it. The engine tests run whole generations on it (tests/engine, ``blas_engine``)."""

from types import SimpleNamespace

import numpy as np
import pytest

from kernels_numba import ops
from kernels_numba._validate import KernelInputError
from kernels_numba.device import download, to_device, zeros
from workbench.config import preset
from workbench.reference.rope import rope_tables


@pytest.fixture
def on_blas(monkeypatch):
    monkeypatch.setattr(ops, "BLAS", True)
    monkeypatch.setattr(ops, "BLAS_MIN_ELEMENTS", 0)


def test_blas_takes_large_fp32_weights_only(monkeypatch):
    rng = np.random.default_rng(0)
    small, large = rng.standard_normal((64, 64)), rng.standard_normal((1024, 1024))
    monkeypatch.setattr(ops, "BLAS", True)
    assert (ops.dense(small).path, ops.dense(large).path) == (ops.PORTABLE, ops.BLAS_PATH)
    assert ops.dense(large, fast=False).path == ops.PORTABLE
    monkeypatch.setattr(ops, "BLAS", False)                     # no GPU: every FP32 op stays portable
    assert ops.dense(large).path == ops.PORTABLE and ops.mla_weights(large).path == ops.PORTABLE


@pytest.mark.parametrize("accumulate", [False, True])
def test_linear_blas_equals_portable(on_blas, accumulate):
    rng = np.random.default_rng(1)
    rows, k, n = 5, 96, 80
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = to_device(rng.standard_normal((rows, k)).astype(np.float32))
    h0 = rng.standard_normal((rows, n)).astype(np.float32)
    meta = to_device(np.array([0, rows, 0, 0, 0, 0, 0, 0], np.int32))
    got, want = to_device(h0), to_device(h0)
    ops.linear(got, x, ops.dense(w), meta, rows, accumulate=accumulate)
    ops.linear(want, x, ops.dense(w, fast=False), meta, rows, accumulate=accumulate)
    np.testing.assert_allclose(download(got), download(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("q_lora", [True, False])
def test_mla_attention_blas_equals_the_kernel(on_blas, q_lora):
    """A tree of new rows (ancestor mask) on top of cached rows, rope positions start + depth; only the
    live rows are compared, and row 2's mask names row 3, which is past meta[1] and must stay unseen.
    13 cache rows: the BLAS core's key mask is padded to 16. The BLAS path with the step's shared rows
    (``ops.attention_rows``, as the engine runs it) gives what it gives computing them itself."""
    cfg = preset("tiny") if q_lora else preset("tiny").replace(q_lora_rank=None)
    rng = np.random.default_rng(2)
    h, c, r = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    nn, v = cfg.qk_nope_head_dim, cfg.v_head_dim
    s_max, start, rows, live = 13, 5, 4, 3
    cache = to_device(rng.standard_normal((s_max, c + r)).astype(np.float32))
    q = to_device(rng.standard_normal((rows, h * (nn + r) + (0 if q_lora else c + r))).astype(np.float32))
    wkv_b = rng.standard_normal((h * (nn + v), c)).astype(np.float32) * 0.1
    depth = to_device(np.array([0, 1, 1, 2], np.int32))
    vis = to_device(np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 1], [1, 1, 0, 1]], np.uint8))
    meta = to_device(np.array([start, live, 0, 0, 0, 0, 0, 0], np.int32))
    cos, sin = (to_device(t) for t in rope_tables(cfg, s_max))
    outs = []
    for w in (ops.mla_weights(wkv_b), ops.mla_weights(wkv_b, fast=False)):
        o = zeros((rows, h * v))
        ops.mla_attention(o, q, cache, w, cos, sin, depth, vis, meta, cfg.softmax_scale, h, c, r, nn, v,
                          s_max, rows)
        outs.append(download(o)[:live])
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-5)
    w = ops.mla_weights(wkv_b)
    att = ops.attention_rows_buffers([w], rows, s_max, r // 2)
    ops.attention_rows(att, cos, sin, depth, vis, meta, rows)
    o = zeros((rows, h * v))
    ops.mla_attention(o, q, cache, w, cos, sin, depth, vis, meta, cfg.softmax_scale, h, c, r, nn, v, s_max,
                      rows, att=att)
    np.testing.assert_array_equal(download(o)[:live], outs[0])      # the same ops on the same inputs
    with pytest.raises(KernelInputError, match="AttentionRows for 16 keys, cache of 24 rows"):
        ops.mla_attention(o, q, to_device(np.zeros((24, c + r), np.float32)), w, cos, sin, depth, vis, meta,
                          cfg.softmax_scale, h, c, r, nn, v, 24, rows, att=att)


def test_swiglu_and_router_fast_paths_equal_portable(on_blas):
    rng = np.random.default_rng(3)
    cfg = preset("tiny")
    rows, d, i, e = 3, cfg.hidden_size, 48, cfg.n_routed_experts
    w1, w3 = (rng.standard_normal((i, d)).astype(np.float32) * 0.1 for _ in range(2))
    w2 = rng.standard_normal((d, i)).astype(np.float32) * 0.1
    gate = rng.standard_normal((e, d)).astype(np.float32) * 0.1
    bias = rng.standard_normal(e).astype(np.float32) * 0.01
    x = to_device(rng.standard_normal((rows, d)).astype(np.float32))
    meta = to_device(np.array([0, rows, 0, 0, 0, 0, 0, 0], np.int32))
    experts = [tuple(rng.standard_normal(m.shape).astype(np.float32) * 0.1 for m in (w1, w3, w2))
               for _ in range(e)]
    got = []
    for fast in (True, False):
        sw = ops.swiglu_weights(w1, w3, w2, fast=fast)
        rt = ops.router(gate, bias, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group, cfg.norm_topk_prob,
                        cfg.routed_scaling_factor, fast=fast)
        m = ops.moe_weights(rt, experts, None, fast=fast)
        assert (sw.path, rt.path) == ((ops.BLAS_PATH, ops.SLICED) if fast else (ops.PORTABLE,) * 2)
        sc = ops.Scratch(rows, [sw], [m])
        sc.reserve(rows)
        hs, hm = zeros((rows, d)), zeros((rows, d))
        ops.swiglu(hs, x, sw, sc, meta, rows)
        ops.moe(hm, x, m, sc, meta, rows)
        got.append((download(hs), download(hm), download(sc.rids)[:rows]))
    np.testing.assert_allclose(got[0][0], got[1][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[0][2], got[1][2])
    np.testing.assert_allclose(got[0][1], got[1][1], rtol=1e-5, atol=1e-6)


def test_sliced_router_without_its_logits_buffer_is_a_one_line_error(on_blas):
    cfg = preset("tiny")
    rng = np.random.default_rng(4)
    e = cfg.n_routed_experts
    rt = ops.router(rng.standard_normal((e, cfg.hidden_size)), np.zeros(e), cfg.num_experts_per_tok,
                    cfg.n_group, cfg.topk_group, cfg.norm_topk_prob, cfg.routed_scaling_factor)
    sc = ops.Scratch(2, [], [])
    meta = to_device(np.array([0, 2, 0, 0, 0, 0, 0, 0], np.int32))
    x = to_device(np.zeros((2, cfg.hidden_size), np.float32))
    with pytest.raises(ops.KernelInputError, match="router logits"):
        ops.route(sc.rids, sc.rwts, x, rt, sc, meta, 2)
    sc = ops.Scratch(2, [], [], routers=(rt,))                                        # with it: routes
    ops.route(sc.rids, sc.rwts, x, rt, sc, meta, 2)
    assert download(sc.rids).shape == (2, cfg.num_experts_per_tok)


def test_w16a16_linear_and_swiglu_are_the_reference_products(on_blas):
    """Bf16Host matrices: bf16(x) @ W.T with float32 sums (workbench.quant.w16a16), whatever the size."""
    from numformats.bf16 import bf16
    from workbench.quant.w16a16 import W16A16
    from workbench.reference.layers import linear, swiglu
    rng = np.random.default_rng(5)
    rows, d, i = 4, 64, 40
    w1, w3, w2 = (bf16(rng.standard_normal(s) * 0.1) for s in ((i, d), (i, d), (d, i)))
    xh = rng.standard_normal((rows, d)).astype(np.float32)
    h0 = rng.standard_normal((rows, d)).astype(np.float32)
    x, meta = to_device(xh), to_device(np.array([0, rows, 0, 0, 0, 0, 0, 0], np.int32))
    dense = ops.dense(ops.Bf16Host(w2.bits.T.copy()))                    # [i, d] as W [N=i, K=d]
    assert dense.path == ops.BLAS_PATH
    out = to_device(h0[:, :i].copy())
    ops.linear(out, x, dense, meta, rows, accumulate=True)
    want = h0[:, :i] + linear({"p": W16A16(bf16(w2.float32().T))}, "p", xh)
    np.testing.assert_allclose(download(out), want, rtol=1e-5, atol=1e-5)
    sw = ops.swiglu_weights(*(ops.Bf16Host(m.bits) for m in (w1, w3, w2)))
    sc = ops.Scratch(rows, [sw], [])
    h = to_device(h0)
    ops.swiglu(h, x, sw, sc, meta, rows)
    ref = swiglu({f"m.{n}": W16A16(m) for n, m in (("w1", w1), ("w3", w3), ("w2", w2))}, "m", xh)
    # silu(g) * u is summed in two orders before its bf16 rounding: an element may round the other way
    # (about 2e-4 here), so this composition is checked to 1e-3; the projection above is exact
    np.testing.assert_allclose(download(h), h0 + ref, rtol=0, atol=1e-3)


def test_w16a16_without_the_blas_path_is_a_one_line_error(monkeypatch):
    from kernels_numba import KernelInputError
    monkeypatch.setattr(ops, "BLAS", False)
    with pytest.raises(KernelInputError, match="W16A16 matrices run on the BLAS path"):
        ops.dense(ops.Bf16Host(np.zeros((4, 4), np.uint16)))
    with pytest.raises(KernelInputError, match="all three matrices or in none"):
        ops.swiglu_weights(ops.Bf16Host(np.zeros((4, 4), np.uint16)), np.zeros((4, 4)), np.zeros((4, 4)))


def test_bf16_experts_on_grouped_gemms_are_the_reference_moe(on_blas):
    """Bf16Host experts with out16 (w16a16(..., experts=True)): one grouped GEMM per projection over the
    (token, expert) pairs, against the reference MoE on the same marked weights."""
    from dataclasses import replace

    from numformats.bf16 import bf16
    from workbench.quant.w16a16 import W16A16
    from workbench.reference.moe import moe
    cfg = replace(preset("tiny"), num_hidden_layers=1, first_k_dense_replace=0)
    e, i, d, k = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size, cfg.num_experts_per_tok
    rng = np.random.default_rng(9)
    mats = [[bf16(rng.standard_normal(s) * 0.1) for s in ((i, d), (i, d), (d, i))] for _ in range(e)]
    shared = [bf16(rng.standard_normal(s) * 0.1) for s in ((i, d), (i, d), (d, i))]
    w = {"layers.0.ffn.gate": rng.standard_normal((e, d)).astype(np.float32) * 0.1,
         "layers.0.ffn.gate_bias": rng.standard_normal(e).astype(np.float32) * 0.01}
    names = ("w1", "w3", "w2")
    for j, ms in enumerate(mats):
        w.update({f"layers.0.ffn.experts.{j}.{n}": W16A16(m, True) for n, m in zip(names, ms, strict=True)})
    w.update({f"layers.0.ffn.shared.{n}": W16A16(m) for n, m in zip(names, shared, strict=True)})
    rt = ops.router(w["layers.0.ffn.gate"], w["layers.0.ffn.gate_bias"], k, cfg.n_group, cfg.topk_group,
                    cfg.norm_topk_prob, cfg.routed_scaling_factor)
    m = ops.moe_weights(rt, [[ops.Bf16Host(x.bits, True) for x in ms] for ms in mats],
                        [ops.Bf16Host(x.bits) for x in shared])
    assert m.path == ops.GROUPED_MM and m.shared.path == (ops.W16A16 if ops.W16_KERNEL else ops.BLAS_PATH)
    rows = 5
    sc = ops.Scratch(rows, [m.shared], [m])
    sc.reserve(rows)
    x = rng.standard_normal((rows, d)).astype(np.float32)
    h0 = rng.standard_normal((rows, d)).astype(np.float32)
    h = to_device(h0)
    ops.moe(h, to_device(x), m, sc, to_device(np.array([0, rows, 0, 0, 0, 0, 0, 0], np.int32)), rows)
    # bf16 roundings of g, u, silu(g) * u and y after float32 sums in two orders: an element may round
    # the other way on some CPU (one bf16 step, 0.4-0.8% of it), so all agree to 1%, and nearly all to
    # float32 noise (which a missing or extra rounding would not)
    got, want = download(h), h0 + moe(cfg, w, 0, x)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-3)
    assert np.mean(np.abs(got - want) <= 1e-5 * (1 + np.abs(want))) > 0.99


def test_bf16_experts_want_the_bf16_output_mark(on_blas):
    from kernels_numba import KernelInputError
    rt = ops.router(np.zeros((2, 4), np.float32), np.zeros(2, np.float32), 1, 1, 1, True, 1.0)
    plain = [[ops.Bf16Host(np.zeros((4, 4), np.uint16)) for _ in range(3)] for _ in range(2)]
    with pytest.raises(KernelInputError, match="out16"):
        ops.moe_weights(rt, plain, None)


def _core_step(name, seed: int) -> SimpleNamespace:
    """A W16A16 attention core's step on the shape of ``name`` (a preset's name or a config): wkv_b's bf16
    bits and the step's inputs, a bf16 cache of 16 rows, 7 cached, a tree of 4 rows of which 3 live."""
    from numformats.bf16 import bf16
    cfg = preset(name) if isinstance(name, str) else name
    rng = np.random.default_rng(seed)
    h, c, r = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    nn, v = cfg.qk_nope_head_dim, cfg.v_head_dim
    s8, start, rows, live = 16, 7, 4, 3
    return SimpleNamespace(
        cfg=cfg, s8=s8, rows=rows, live=live,
        cache=to_device(bf16(rng.standard_normal((s8, c + r)).astype(np.float32)).bits.view(np.int16)),
        q=to_device(rng.standard_normal((rows, h * (nn + r))).astype(np.float32)),
        bits=bf16(rng.standard_normal((h * (nn + v), c)).astype(np.float32) * 0.1).bits,
        depth=to_device(np.array([0, 1, 1, 2], np.int32)),
        vis=to_device(np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], np.uint8)),
        meta=to_device(np.array([start, live, 0, 0, 0, 0, 0, 0], np.int32)),
        rope=tuple(to_device(t) for t in rope_tables(cfg, s8)))


def _core_out(st: SimpleNamespace, w, att=None) -> np.ndarray:
    """o [rows, H*V] of ``ops.mla_attention`` with the weights ``w`` over ``_core_step``'s inputs."""
    cfg = st.cfg
    h, v = cfg.num_attention_heads, cfg.v_head_dim
    o = zeros((st.rows, h * v))
    with ops.sim_speed():
        if att is not None:
            ops.attention_rows(att, *st.rope, st.depth, st.vis, st.meta, st.rows)
        ops.mla_attention(o, st.q, st.cache, w, *st.rope, st.depth, st.vis, st.meta, cfg.softmax_scale, h,
                          cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, v, st.s8, st.rows,
                          att=att)
    return download(o)


def test_w16a16_attention_core_kernel_equals_torch_core(on_blas, monkeypatch):
    """The W16A16 attention core on mla.py's core kernel (``ops.W16_CORE_KERNEL``) against torch's masked
    softmax and p @ c_kv over the same bf16 cache, tree and scores, within what rounding p and ctx to
    bf16 in another summation order moves; the rows past meta[1] read zeros on the kernel."""
    st = _core_step("tiny", 3)
    w = ops.mla_weights(ops.Bf16Host(st.bits))
    outs = []
    for kernel in (True, False):
        monkeypatch.setattr(ops, "W16_CORE_KERNEL", kernel)
        outs.append(_core_out(st, w))
    np.testing.assert_allclose(outs[0][:st.live], outs[1][:st.live], rtol=2e-2, atol=2e-3)
    assert (outs[0][st.live:] == 0).all()


@pytest.mark.parametrize("softmax", [True, False])
def test_w16a16_absorptions_on_the_kernel_equal_the_bmm_core(on_blas, monkeypatch, softmax):
    """The W16A16 core with W_UK and W_UV as grouped W16A16 products (``ops.W16_ABSORB``, the rope part
    of the query rows by ``mla.q_rope_kernel``), its softmax on ``mla.softmax16_kernel`` or torch's
    (``ops.W16_SOFTMAX``), against cuBLAS's / torch's bmm over the same bf16 cache and tree: q_lat, p,
    ctx and o are rounded to bf16 after float32 sums in other orders, so within a few bf16 steps; rows
    past meta[1] are finite (zeros in, never read as live)."""
    st = _core_step("tiny2", 5)
    cfg = st.cfg
    monkeypatch.setattr(ops, "W16_KERNEL", True)
    monkeypatch.setattr(ops, "W16_SOFTMAX", softmax)
    outs = []
    for absorb in (True, False):
        monkeypatch.setattr(ops, "W16_ABSORB", absorb)
        w = ops.mla_weights(ops.Bf16Host(st.bits), n_heads=cfg.num_attention_heads, nope=cfg.qk_nope_head_dim)
        assert (w.uk is not None) == absorb
        att = ops.attention_rows_buffers([w], st.rows, st.s8, cfg.qk_rope_head_dim // 2)
        assert (att.q_all is not None) == absorb and att.hidden is not None
        outs.append(_core_out(st, w, att))
    np.testing.assert_allclose(outs[0][:st.live], outs[1][:st.live], rtol=2e-2, atol=2e-3)
    assert np.isfinite(outs[0]).all()
    o16 = outs[0].view(np.uint32) & 0xFFFF                         # o rounded to bf16: no low bits
    assert (o16 == 0).all()


def test_w16a16_one_pass_core_equals_the_bmm_core(on_blas, monkeypatch):
    """The absorbed core with scores, softmax and p @ c_kv in one pass (``ops.W16_FLASH``, mla_flash.py)
    against cuBLAS's / torch's bmm core, on a shape it tiles (16 heads): each output within a bf16 step of
    itself (o is rounded to bf16) plus what rounding p to bf16 moves (the bmm core rounds p after the
    division by the softmax's sum, as the reference; this core before it: nearer float64 here, 1.9e-3
    against 4.9e-3 of ctx's largest 2.8, so the two may differ by both)."""
    cfg = preset("tiny2").replace(num_attention_heads=16, kv_lora_rank=64, qk_rope_head_dim=32)
    monkeypatch.setattr(ops.mla_flash, "CS", 1)                  # (one warp a head group: 64 columns)
    assert ops.mla_flash.fits(16, 64, 32, cfg.qk_nope_head_dim)
    st = _core_step(cfg, 6)
    monkeypatch.setattr(ops, "W16_KERNEL", True)
    calls = []
    flash_mla = ops.flash_mla
    monkeypatch.setattr(ops, "flash_mla", lambda *a, **k: calls.append(1) or flash_mla(*a, **k))
    outs = []
    for flash in (True, False):
        monkeypatch.setattr(ops, "W16_ABSORB", flash)
        monkeypatch.setattr(ops, "W16_FLASH", flash)
        w = ops.mla_weights(ops.Bf16Host(st.bits), n_heads=cfg.num_attention_heads, nope=cfg.qk_nope_head_dim)
        att = ops.attention_rows_buffers([w], st.rows, st.s8, cfg.qk_rope_head_dim // 2)
        outs.append(_core_out(st, w, att))
    assert calls == [1]                                            # the one-pass core ran, once
    flash, bmm = outs[0][:st.live], outs[1][:st.live]
    assert np.all(np.abs(flash - bmm) <= 2 ** -7 * np.abs(bmm) + 8e-3 * np.abs(bmm).max())
    assert np.isfinite(outs[0]).all()


def test_attention_rows_gather_the_rope_rows_and_mask_the_unseen_keys(on_blas, monkeypatch):
    """The step's rows for the BLAS cores: row i's (cos, sin) at start + depth[i] (copies of the table,
    so exactly), (1, 0) past the live rows; the key mask hides what the tree mask and meta[1] hide, and
    is not built where no core reads it (the core kernel on)."""
    import torch
    monkeypatch.setattr(ops, "W16_CORE_KERNEL", True)
    cfg = preset("tiny")
    r, s8, start, rows, live = cfg.qk_rope_head_dim, 16, 5, 4, 3
    cos_h, sin_h = rope_tables(cfg, s8)
    cos, sin = to_device(cos_h), to_device(sin_h)
    depth = np.array([0, 1, 1, 2], np.int32)
    vis = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 1], [1, 1, 0, 1]], np.uint8)
    meta = to_device(np.array([start, live, 0, 0, 0, 0, 0, 0], np.int32))
    h, c, w_rows = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.num_attention_heads * 32
    fp32 = ops.mla_weights(np.zeros((w_rows, c), np.float32))                  # a core that reads the mask
    w16 = ops.mla_weights(ops.Bf16Host(np.zeros((w_rows, c), np.uint16)))     # the core kernel: no mask
    assert h and fp32.path == w16.path == ops.BLAS_PATH
    for mask, attns in ((True, [fp32, w16]), (False, [w16])):
        att = ops.attention_rows_buffers(attns, rows, s8, r // 2)
        ops.attention_rows(att, cos, sin, to_device(depth), to_device(vis), meta, rows)
        rot = att.rot.cpu().numpy()
        pos = start + depth[:live]
        np.testing.assert_array_equal(rot[:live].real, cos_h[pos])
        np.testing.assert_array_equal(rot[:live].imag, sin_h[pos])
        assert (rot[live:] == 1).all()
        if not mask:
            assert att.hidden is None
            continue
        seen = ~att.hidden.cpu().numpy()[:live]                               # [live, S8]
        want = np.zeros((live, s8), bool)
        want[:, :start] = True
        want[:, start:start + live] = vis[:live, :live] != 0                   # row 2's slot 3 is not live
        np.testing.assert_array_equal(seen, want)
        assert isinstance(att.hidden, torch.Tensor)


def test_a_core_that_reads_the_key_mask_refuses_rows_without_it(on_blas, monkeypatch):
    monkeypatch.setattr(ops, "W16_CORE_KERNEL", True)                         # rows built without the mask
    cfg = preset("tiny")
    h, c, r = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    nn, v, s8, rows = cfg.qk_nope_head_dim, cfg.v_head_dim, 16, 2
    w16 = ops.mla_weights(ops.Bf16Host(np.zeros((h * (nn + v), c), np.uint16)))
    fp32 = ops.mla_weights(np.zeros((h * (nn + v), c), np.float32))
    att = ops.attention_rows_buffers([w16], rows, s8, r // 2)                # no mask: the core kernel's rows
    cos, sin = (to_device(t) for t in rope_tables(cfg, s8))
    depth, vis = to_device(np.zeros(rows, np.int32)), to_device(np.eye(rows, dtype=np.uint8))
    meta = to_device(np.array([3, rows, 0, 0, 0, 0, 0, 0], np.int32))
    ops.attention_rows(att, cos, sin, depth, vis, meta, rows)
    with pytest.raises(KernelInputError, match="needs the step's key mask"):
        ops.mla_attention(zeros((rows, h * v)), to_device(np.zeros((rows, h * (nn + r)), np.float32)),
                          to_device(np.zeros((s8, c + r), np.float32)), fp32, cos, sin, depth, vis, meta,
                          cfg.softmax_scale, h, c, r, nn, v, s8, rows, att=att)


def test_w16a16_swiglu_in_one_persistent_launch_is_the_three_launches(on_blas, monkeypatch):
    """``ops.W16_PERSISTENT``: a W16A16 SwiGLU (a shape both products tile alike) through ``ops.swiglu``
    in one cooperative kernel gives the bits of its three launches; the kernel ran; 9 rows take the
    three launches (one row tile only)."""
    import torch

    from numformats.bf16 import bf16
    rng = np.random.default_rng(12)
    d, i = 352, 416                                                # tests/kernels/test_persistent.py's
    ws = [bf16(rng.standard_normal(s) / np.sqrt(s[0])).bits for s in ((d, 2 * i), (i, d))]
    w13_t, w2_t = (torch.from_numpy(np.ascontiguousarray(b).view(np.int16)).view(torch.bfloat16) for b in ws)
    monkeypatch.setattr(ops, "W16_KERNEL", True)
    sw = ops.swiglu_w16(i, d, w13_t, w2_t)
    assert sw.path == ops.W16A16
    calls = []
    persistent_swiglu = ops.persistent.persistent_swiglu
    monkeypatch.setattr(ops.persistent, "persistent_swiglu",
                        lambda *a, **k: calls.append(a[6]) or persistent_swiglu(*a, **k))
    rows = 9
    sc = ops.Scratch(rows, [sw], [])
    x = to_device(rng.standard_normal((rows, d)).astype(np.float32))
    h0 = rng.standard_normal((rows, d)).astype(np.float32)
    meta = to_device(np.array([0, rows, 0, 0, 0, 0, 0, 0], np.int32))
    for t in (2, 9):
        outs = []
        for on in (False, True):
            monkeypatch.setattr(ops, "W16_PERSISTENT", on)
            h = to_device(h0.copy())
            with ops.sim_speed():
                ops.swiglu(h, x, sw, sc, meta, t)
            outs.append(download(h))
        assert np.array_equal(outs[0], outs[1]), t
    assert calls == [2]

"""fused_moe against workbench.reference.moe.moe (routing from the reference moe_gate), both tiers.

The basic cases run under numba's plain simulator; the configuration sweeps under ``sim_speed`` (the
simulator's pooled executor: the same kernels, tens of times faster)."""

import contextlib
from dataclasses import replace

import numpy as np
import pytest

from kernels_numba import KernelInputError
from kernels_numba.moe import (
    GEMV_TOKENS,
    choose_moe_config,
    fused_moe,
    moe_stages,
    moe_workspace,
    prepare_moe,
)
from kernels_numba.sim import sim_speed
from workbench.config import preset
from workbench.quant.int4 import gen_quant4
from workbench.reference.moe import moe, moe_gate

from .helpers import SIMULATED, assert_close, dev, gpu, host, needs_gpu, poisoned

SMALL = {"gu": (2, 1, 2, 1), "dn": (1, 1, 3, 2), "blocks": 3, "maxreg": 128}   # few simulated warps


def _model(cfg, seed, group=32):
    """INT4 weights dict of layer 0 (reference names) + the kernel's repacked MoEWeights."""
    e, i, d, s = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size, cfg.n_shared_experts
    rng = np.random.default_rng(seed)
    w, stacks, shared = {}, {}, []
    for ex in [*range(e), "shared"]:
        pre = f"layers.0.ffn.experts.{ex}" if ex != "shared" else "layers.0.ffn.shared"
        width = i if ex != "shared" else s * i
        for nm, (n, k) in (("w1", (width, d)), ("w3", (width, d)), ("w2", (d, width))):
            _, p, sc = gen_quant4(n, k, group, seed=int(rng.integers(1 << 30)))
            w[f"{pre}.{nm}.packed"], w[f"{pre}.{nm}.scale"] = p, sc
            (shared.extend((p, sc)) if ex == "shared" else stacks.setdefault(nm, []).append((p, sc)))
    w["layers.0.ffn.gate"] = rng.standard_normal((e, d)).astype(np.float32) * 0.1
    w["layers.0.ffn.gate_bias"] = rng.standard_normal(e).astype(np.float32) * 0.01
    st = [np.stack([t[j] for t in stacks[nm]]) for nm in ("w1", "w3", "w2") for j in (0, 1)]
    mw = prepare_moe(*st, shared=shared if s else None)
    return w, (mw if SIMULATED else mw.to_device())


def _check(cfg, t, seed, config=None, group=32, plain=False):
    w, mw = _model(cfg, seed, group)
    x = np.random.default_rng(seed + 1).standard_normal((t, cfg.hidden_size)).astype(np.float16)
    xf = x.astype(np.float32)
    idx, tw = moe_gate(cfg, xf, w["layers.0.ffn.gate"], w["layers.0.ffn.gate_bias"])
    out = poisoned((t, cfg.hidden_size))
    with contextlib.nullcontext() if plain else sim_speed():
        fused_moe(dev(x), dev(idx.astype(np.int32)), dev(tw.astype(np.float32)), mw, out=out,
                  config=config, check_routing=True)
    # h = silu(gate) * up is rounded to float16 before the down projection (as in the reference), so a
    # summation-order difference in gate/up can move h by one f16 ulp (2^-11 relative): tolerance 2e-3
    assert_close(host(out), moe(cfg, w, 0, xf), rtol=2e-3, atol_rel=2e-3, what=f"T={t}")
    return idx


@pytest.mark.parametrize("t", [1, 3])
def test_tiny_matches_reference(t):
    _check(preset("tiny"), t, seed=t, config=SMALL, plain=True)


# stream-K shares (warps per block, chunks per step, steps in flight, n-tiles per unit): one warp doing
# everything (whole units only); more warps than steps (empty shares, every unit split); steps of 2
# chunks with 3 in flight and 4 n-tiles per unit; group size 64 (one scale per chunk)
@pytest.mark.parametrize("config,group", [
    ({"gu": (1, 2, 1, 1), "dn": (1, 1, 1, 1), "blocks": 1, "maxreg": 128}, 32),
    ({"gu": (2, 1, 2, 2), "dn": (3, 1, 2, 1), "blocks": 11, "maxreg": 128}, 32),
    ({"gu": (2, 2, 3, 4), "dn": (2, 1, 4, 8), "blocks": 3, "maxreg": 128}, 64)])
def test_tiny_stream_k_shares(config, group):
    _check(preset("tiny"), 2, seed=11, config=config, group=group)


def test_down_four_chunks_per_step():
    """The down tiling choose_moe_config takes for 2 <= T <= 32 (4 chunks per step, one n-tile per
    unit) at an expert width where 4 chunks divide I/64."""
    cfg = replace(preset("tiny"), moe_intermediate_size=256)
    _check(cfg, 2, seed=21, config={"gu": (2, 2, 2, 1), "dn": (2, 4, 2, 1), "blocks": 3, "maxreg": 128})


def _split_paths(total, ksteps, blocks, wpb):
    """How the units of a two-level stream-K schedule end (moe_gemm.py): whole in one warp, split
    between warps of a block, a cross-block piece of one warp (published at once) or of several
    warps (published after the block's syncthreads)."""
    kinds = set()
    for blk in range(blocks):
        lo_b, hi_b = blk * total // blocks, (blk + 1) * total // blocks
        for w in range(wpb):
            a, b = lo_b + w * (hi_b - lo_b) // wpb, lo_b + (w + 1) * (hi_b - lo_b) // wpb
            s = a
            while s < b:
                u0 = s // ksteps * ksteps
                lo, hi = max(a, u0), min(b, u0 + ksteps)
                cross = u0 < lo_b or u0 + ksteps > hi_b
                if hi - lo == ksteps:
                    kinds.add("whole")
                elif lo == max(lo_b, u0):
                    kinds.add(("deferred" if hi < min(hi_b, u0 + ksteps) else "early") if cross else "warps")
                s = hi
    return kinds


def test_stream_k_split_paths():
    """Units of 12 steps, warp shares of ~2-5: every way a unit can be split is taken (checked on the
    schedule of this very routing), and the sums match the reference."""
    cfg = replace(preset("tiny"), hidden_size=768, moe_intermediate_size=128)
    config = {"gu": (8, 1, 2, 1), "dn": (4, 1, 2, 2), "blocks": 5, "maxreg": 128}
    idx = _check(cfg, 2, seed=5, config=config)
    tiles = sum(-(-int(c) // 8) for c in np.bincount(idx.ravel())) + cfg.n_shared_experts
    gu = _split_paths(tiles * 8 * 12, 12, 5, 8)                # NU = 128/16, KSTEPS = 768/64
    dn = _split_paths(tiles * 24 * 2, 2, 5, 4)                 # NU = 768/16/2, KSTEPS = 128/64
    assert gu >= {"warps", "early", "deferred"} and dn >= {"warps", "early"}, (gu, dn)


def test_align_puts_each_experts_pairs_in_pair_order():
    """Tiles hold each expert's pairs in increasing pair order whatever order the atomics serve them in:
    the tile a pair lands in decides where the stream-K GEMMs split its sums, so this makes the output
    the same from run to run. 40 tokens over 4 experts: several tiles per expert."""
    cfg = replace(preset("tiny"), n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1)
    _, mw = _model(cfg, 61)
    t, k, e = 40, 2, cfg.n_routed_experts
    rng = np.random.default_rng(62)
    ids = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
    x = rng.standard_normal((t, cfg.hidden_size)).astype(np.float16)
    tw = np.full((t, k), 0.5, np.float32)
    ws = moe_workspace(t, k, mw, config=SMALL)
    with sim_speed():
        fused_moe(dev(x), dev(ids), dev(tw), mw, workspace=ws, config=SMALL)
    pair_expert = [*ids.ravel(), *(e + s for s in range(cfg.n_shared_experts) for _ in range(t))]
    want = []
    for ex in range(e + cfg.n_shared_experts):
        mine = [p for p, pe in enumerate(pair_expert) if pe == ex]
        want += mine + [-1] * (-len(mine) % 8)
    assert host(ws.tile_rows)[:len(want)].tolist() == want


def test_few_tokens_gemv_path():
    """At G = 32 the default is the GEMV path (moe_gemv.py): per pair up to GEMV_TOKENS tokens, over the
    expert tiles above; G = 64 takes the stream-K one; all match the reference."""
    cfg = preset("tiny")
    d, i = cfg.hidden_size, cfg.moe_intermediate_size
    assert all("gemv" in choose_moe_config(d, i, t) and "tiled" not in choose_moe_config(d, i, t)
               for t in range(1, GEMV_TOKENS + 1))
    assert choose_moe_config(d, i, GEMV_TOKENS + 1).get("tiled") is True
    assert "gemv" not in choose_moe_config(d, i, 1, g=64)
    _check(cfg, 1, seed=31)
    _check(cfg, 3, seed=33)
    _check(cfg, GEMV_TOKENS + 2, seed=34)
    _check(cfg, 1, seed=32, group=64)


def _tiny_routing(model_seed, seed, t=11):
    """The tiny preset's experts (seed ``model_seed``), its T = 1 config, and ``t`` random tokens with their
    routing (distinct experts a token) and router weights."""
    cfg = preset("tiny")
    _, mw = _model(cfg, model_seed)
    k = cfg.num_experts_per_tok
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((t, cfg.hidden_size)).astype(np.float16)
    ids = np.stack([rng.choice(cfg.n_routed_experts, k, replace=False) for _ in range(t)]).astype(np.int32)
    tw = rng.random((t, k)).astype(np.float32)
    return mw, choose_moe_config(cfg.hidden_size, cfg.moe_intermediate_size, 1), x, ids, tw


def test_tiled_gemv_rows_equal_the_per_pair_rows_bit_for_bit():
    """The tiled path computes each pair as the per-pair path does: every token's output equals, bit for
    bit, that token's output alone (T = 1) and its output in the per-pair path at T tokens; tiles of one
    expert hold up to 8 pairs, so an expert with more than 8 spills into a second tile, and fewer grid
    rows than tiles make a block walk several."""
    mw, base, x, ids, tw = _tiny_routing(61, 62)
    t = len(x)
    ids[:9, 0] = 3                                                 # expert 3 has 9 pairs: two tiles
    with sim_speed():
        tiled = host(fused_moe(dev(x), dev(ids), dev(tw), mw, config={**base, "tiled": True, "rows": 2}))
        pairs = host(fused_moe(dev(x), dev(ids), dev(tw), mw, config=base))
        alone = np.concatenate([host(fused_moe(dev(x[r:r + 1]), dev(ids[r:r + 1]), dev(tw[r:r + 1]), mw))
                                for r in range(t)])
    assert np.array_equal(tiled, pairs) and np.array_equal(tiled, alone)


def test_gate_up_forming_h_equals_the_act_launch_bit_for_bit():
    """``glu``: a gate/up block holds both halves of its 16 rows and forms h = f16(silu(gate) * up) in its
    epilogue, in place of the act launch: the same sums, so the same bits, per pair and over expert
    tiles (with the shared expert among the pairs)."""
    mw, base, x, ids, tw = _tiny_routing(71, 72)
    with sim_speed():
        for path in ({}, {"tiled": True, "rows": 2}):
            want = host(fused_moe(dev(x), dev(ids), dev(tw), mw, config={**base, **path}))
            glu = {**base, **path, "glu": True}
            got = host(fused_moe(dev(x), dev(ids), dev(tw), mw, config=glu))
            assert np.array_equal(got, want), path
            names = [n for n, _ in moe_stages(dev(x), dev(ids), dev(tw), mw, config=glu)[0]]
            assert names == ["align"] * bool(path) + ["gate_up", "down", "combine"]


def test_gemv_path_without_shared_experts_equals_stream_k():
    """No shared experts (P = K pairs): the GEMV path against the stream-K one on the same inputs; each
    adding into given rows (``accumulate``)."""
    cfg = preset("tiny")
    d, i, e = cfg.hidden_size, cfg.moe_intermediate_size, cfg.n_routed_experts
    rng = np.random.default_rng(51)
    mats = [gen_quant4(n, k, 32, seed=int(rng.integers(1 << 30)))[1:] for n, k in [(i, d), (i, d), (d, i)]
            for _ in range(e)]
    st = [np.stack([m[j] for m in mats[q * e:(q + 1) * e]]) for q in range(3) for j in (0, 1)]
    mw = prepare_moe(*st)
    mw = mw if SIMULATED else mw.to_device()
    x = dev(rng.standard_normal((1, d)).astype(np.float16))
    ids, tw = dev(np.array([[5, 2]], np.int32)), dev(np.array([[0.7, 0.3]], np.float32))
    with sim_speed():
        got = fused_moe(x, ids, tw, mw, check_routing=True)
        want = fused_moe(x, ids, tw, mw, config=SMALL, check_routing=True)
    assert_close(host(got), host(want), rtol=2e-3, atol_rel=2e-3, what="no shared")
    base = rng.standard_normal((1, d)).astype(np.float32)
    for config in (None, SMALL):                            # both combines add into the residual rows
        out = dev(base.copy())
        with sim_speed():
            plain = host(fused_moe(x, ids, tw, mw, config=config))
            fused_moe(x, ids, tw, mw, out=out, config=config, accumulate=True)
        assert np.array_equal(host(out), base + plain)     # one float32 addition, as a separate add
    with pytest.raises(KernelInputError, match="accumulate needs an out"):
        fused_moe(x, ids, tw, mw, accumulate=True)


def test_routed_slice_is_the_stack_of_those_experts():
    """MoEWeights.routed(range(a, b)): views of experts a..b-1 as a stack of their own (local ids 0..),
    the same fused_moe output as the stack prepared from those experts alone; bad ranges raise."""
    cfg = preset("tiny")
    d, i, e = cfg.hidden_size, cfg.moe_intermediate_size, 6
    rng = np.random.default_rng(52)
    mats = [[gen_quant4(n, k, 32, seed=int(rng.integers(1 << 30)))[1:] for _ in range(e)]
            for n, k in [(i, d), (i, d), (d, i)]]

    def stack(ex):
        return prepare_moe(*(np.stack([mats[q][j][a] for j in ex]) for q in range(3) for a in (0, 1)))
    whole, alone = stack(range(e)), stack(range(2, 5))
    part = whole.routed(range(2, 5))
    assert (part.n_routed, part.n_shared, part.w13.experts, part.w2.experts) == (3, 0, 3, 3)
    if SIMULATED:
        assert np.shares_memory(part.w13.wq, whole.w13.wq) and np.shares_memory(part.w2.sq, whole.w2.sq)
    else:
        whole, alone = whole.to_device(), alone.to_device()
        part = whole.routed(range(2, 5))
    x = dev(rng.standard_normal((3, d)).astype(np.float16))
    ids = dev(np.array([[0, 2], [1, 3], [2, 1]], np.int32))          # id 3 (= E of the slice) is dropped
    tw = dev(rng.random((3, 2)).astype(np.float32))
    with sim_speed():
        got, want = (fused_moe(x, ids, tw, w, config=SMALL) for w in (part, alone))
    assert_close(host(got), host(want), rtol=1e-6, atol_rel=1e-6, what="slice")
    for bad in (range(0, 0), range(4, 7), range(0, 4, 2), [0, 1]):
        with pytest.raises(KernelInputError, match="range inside"):
            whole.routed(bad)


def test_gemv_path_flags_bad_ids_and_clears_the_flag():
    cfg = preset("tiny")
    _, mw = _model(cfg, 9)
    x = dev(np.ones((1, cfg.hidden_size), np.float16))
    tw = dev(np.ones((1, 2), np.float32))
    ws = moe_workspace(1, 2, mw)
    out = poisoned((1, cfg.hidden_size))
    with pytest.raises(KernelInputError, match="outside"), sim_speed():
        fused_moe(x, dev(np.array([[3, 8]], np.int32)), tw, mw, out=out, workspace=ws, check_routing=True)
    # the bad pair adds exactly 0: the same as a good expert at weight 0 (and the flag is cleared)
    with sim_speed():
        want = fused_moe(x, dev(np.array([[3, 5]], np.int32)), dev(np.array([[1, 0]], np.float32)), mw,
                         workspace=ws, check_routing=True)
    np.testing.assert_array_equal(host(out), host(want))


def test_bad_expert_ids_flagged_and_bad_shapes_raise():
    cfg = preset("tiny")
    _, mw = _model(cfg, 9)
    x = dev(np.zeros((2, cfg.hidden_size), np.float16))
    tw = dev(np.ones((2, 2), np.float32))
    ws = moe_workspace(2, 2, mw, config=SMALL)
    nan_y = np.full(np.asarray(ws.y).shape if SIMULATED else ws.y.shape, np.nan, np.float32)
    np.copyto(ws.y, nan_y) if SIMULATED else ws.y.copy_to_device(nan_y)
    out = poisoned((2, cfg.hidden_size))
    with pytest.raises(KernelInputError, match="outside"):
        fused_moe(x, dev(np.array([[0, 8], [1, 2]], np.int32)), tw, mw, out=out, workspace=ws, config=SMALL,
                  check_routing=True)
    # the dropped pair's y row is never written (NaN here); the combine leaves it out: x = 0 gives 0
    np.testing.assert_array_equal(host(out), np.zeros((2, cfg.hidden_size), np.float32))
    with pytest.raises(KernelInputError, match="dtype"):
        fused_moe(x, dev(np.zeros((2, 2), np.int64)), tw, mw)
    with pytest.raises(KernelInputError, match="shape"):
        fused_moe(x, dev(np.zeros((2, 2), np.int32)), dev(np.ones((2, 3), np.float32)), mw)
    with pytest.raises(KernelInputError, match="workspace"):
        fused_moe(x, dev(np.zeros((2, 2), np.int32)), tw, mw, workspace=moe_workspace(3, 2, mw))
    with pytest.raises(KernelInputError, match="prepare_moe"):
        fused_moe(x, dev(np.zeros((2, 2), np.int32)), tw, mw.w13)


def test_bad_configs_raise_before_launch():
    cfg = preset("tiny")
    _, mw = _model(cfg, 9)
    x = dev(np.zeros((2, cfg.hidden_size), np.float16))
    ids, tw = dev(np.zeros((2, 2), np.int32)), dev(np.ones((2, 2), np.float32))
    out = poisoned((2, cfg.hidden_size))
    for bad in ({**SMALL, "gu": (2, 1, 5, 1)},              # 5 steps in flight: the kernel unrolls <= 4
                {**SMALL, "dn": (2, 3, 2, 1)},              # 3 chunks per step do not divide I/64
                {**SMALL, "gu": (2, 1, 2, 3)},              # 3 n-tiles per unit do not divide I/16
                {**SMALL, "blocks": 0},
                {**SMALL, "gu": (2, 1, 2)},                 # a tiling of 3 numbers, not 4
                {k: v for k, v in SMALL.items() if k != "maxreg"}):
        with pytest.raises(KernelInputError, match="bad MoE config"):
            fused_moe(x, ids, tw, mw, out=out, config=bad)
    gemv = {"gemv": True, "gu": (2, 1), "dn": (1, 1), "maxreg": 128}
    x1, ids1, tw1, out1 = x[:1], ids[:1], tw[:1], poisoned((1, cfg.hidden_size))
    for bad in ({**gemv, "gu": (3, 1)}, {**gemv, "dn": (1, 2)}, {**gemv, "gemv": 1}, {**gemv, "maxreg": 16},
                {**gemv, "tiled": 1}, {**gemv, "tiled": True, "rows": 0}, {**gemv, "glu": 1}):
        with pytest.raises(KernelInputError, match="bad MoE config"):
            fused_moe(x1, ids1, tw1, mw, out=out1, config=bad)
    _, mw64 = _model(cfg, 9, group=64)
    with pytest.raises(KernelInputError, match="bad MoE config"):
        fused_moe(x1, ids1, tw1, mw64, out=out1, config=gemv)
    t9 = GEMV_TOKENS + 1                                    # a stream-K workspace has no gate/up buffer
    x9 = dev(np.zeros((t9, cfg.hidden_size), np.float16))
    ids9, tw9 = dev(np.zeros((t9, 2), np.int32)), dev(np.ones((t9, 2), np.float32))
    with pytest.raises(KernelInputError, match="no room"):
        fused_moe(x9, ids9, tw9, mw, workspace=moe_workspace(t9, 2, mw, config=SMALL), config=gemv)
    big = {**SMALL, "blocks": 50}                           # more warps than the workspace was made for
    with pytest.raises(KernelInputError, match="part buffer"):
        fused_moe(x, ids, tw, mw, out=out, workspace=moe_workspace(2, 2, mw, config=SMALL), config=big)
    assert np.isnan(host(out)).all() and np.isnan(host(out1)).all()   # nothing was launched


@gpu
@needs_gpu
@pytest.mark.parametrize("t", [1, 5, 33])
def test_gpu_moe(t):
    cfg = replace(preset("tiny"), hidden_size=1024, moe_intermediate_size=512, n_routed_experts=16,
                  num_experts_per_tok=4, n_group=1, topk_group=1)
    _check(cfg, t, seed=t)


@gpu
@needs_gpu
def test_gpu_moe_k2_width():
    """Real K2 widths (D = 7168, I = 2048, G = 32), few experts."""
    cfg = replace(preset("tiny"), hidden_size=7168, moe_intermediate_size=2048, n_routed_experts=4,
                  num_experts_per_tok=2, n_group=1, topk_group=1)
    _check(cfg, 3, seed=7)


@gpu
@needs_gpu
def test_gpu_moe_k2_width_one_token():
    """The GEMV path at K2 widths and its default tiling (gate/up 8 x 14, down 4 x 8 chunks)."""
    cfg = replace(preset("tiny"), hidden_size=7168, moe_intermediate_size=2048, n_routed_experts=4,
                  num_experts_per_tok=2, n_group=1, topk_group=1)
    assert "gemv" in choose_moe_config(7168, 2048, 1)
    _check(cfg, 1, seed=8)

"""kernels_numba.ops: which kernels a prepared weight takes (the tile layout's shape rule), and both paths
of ``swiglu`` and ``moe`` against the reference's W4A16 (``workbench.reference``) on fresh random inputs,
in both tiers. Device arrays are the engine's (``kernels_numba.device``); runs use the fast simulator."""

from dataclasses import replace

import numpy as np
import pytest

from kernels_numba import KernelInputError, ops
from kernels_numba.device import download, head_rows, on_gpu, to_device, zeros
from kernels_numba.sim import sim_speed
from workbench.config import preset
from workbench.quant.int4 import gen_quant4
from workbench.reference.layers import swiglu
from workbench.reference.moe import moe

from .helpers import assert_close


def _int4(n, k, seed, group=32):
    _, packed, scale = gen_quant4(n, k, group, seed=seed)
    return ops.Int4Host(packed, scale)


def _swiglu_mats(d, i, seed, int4=True, group=32):
    if not int4:
        rng = np.random.default_rng(seed)
        return tuple(rng.standard_normal(s).astype(np.float32) * 0.1 for s in ((i, d), (i, d), (d, i)))
    return _int4(i, d, seed, group), _int4(i, d, seed + 1, group), _int4(d, i, seed + 2, group)


def _as_weights(prefix, mats):
    w = {}
    for name, m in zip(("w1", "w3", "w2"), mats, strict=True):
        if isinstance(m, ops.Int4Host):
            w[f"{prefix}.{name}.packed"], w[f"{prefix}.{name}.scale"] = m.packed, m.scale
        else:
            w[f"{prefix}.{name}"] = m
    return w


@pytest.mark.parametrize("d,i,group,int4,path", [
    (128, 64, 32, True, ops.INT4_MATMUL), (192, 256, 64, True, ops.INT4_MATMUL),
    (128, 32, 32, True, ops.PORTABLE),      # w2 has K = 32: no 64-column chunk
    (96, 64, 32, True, ops.PORTABLE),       # w1 / w3 have K = 96
    (128, 64, 32, False, ops.PORTABLE)])
def test_swiglu_path_follows_the_tile_layout_rule(d, i, group, int4, path):
    assert ops.swiglu_weights(*_swiglu_mats(d, i, 1, int4, group)).path == path


def test_scales_float16_cannot_hold_stay_portable():
    """The tile layout stores float16 scales: float32 / bfloat16 scales go there only when exact."""
    w1, w3, w2 = _swiglu_mats(128, 64, 2)
    exact = ops.Int4Host(w2.packed, w2.scale.astype(np.float32))            # float16 values: exact
    assert ops.swiglu_weights(w1, w3, exact).path == ops.INT4_MATMUL
    finer = ops.Int4Host(w2.packed, w2.scale.astype(np.float32) * np.float32(1 + 2 ** -13))
    assert ops.swiglu_weights(w1, w3, finer).path == ops.PORTABLE
    bf16 = ops.Int4Host(w2.packed, (w2.scale.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
    assert ops.swiglu_weights(w1, w3, bf16).path == ops.INT4_MATMUL     # bfloat16 (checkpoints): fits


@pytest.mark.parametrize("d,i,path", [(128, 64, ops.INT4_MATMUL), (192, 32, ops.PORTABLE)])
def test_swiglu_both_paths_match_the_reference(d, i, path):
    rows, live = 3, 2
    mats = _swiglu_mats(d, i, 5)
    w = ops.swiglu_weights(*mats)
    assert w.path == path
    sc = ops.Scratch(rows, [w], [])
    rng = np.random.default_rng(7)
    x = rng.standard_normal((rows, d)).astype(np.float32)
    h0 = rng.standard_normal((rows, d)).astype(np.float32)
    h = to_device(h0)
    meta = to_device(np.array([0, live, 0, 0, 0, 0, 0, 0], np.int32))
    with sim_speed():
        ops.swiglu(h, to_device(x), w, sc, meta, rows)
    got = download(h)
    want = h0[:live] + swiglu(_as_weights("m", mats), "m", x[:live])
    assert_close(got[:live], want, rtol=2e-3, atol_rel=2e-3, what=path)
    np.testing.assert_array_equal(got[live:], h0[live:])                  # rows >= meta[1] untouched


def _moe_model(cfg, seed, shared_int4=True):
    e, i, d = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
    rng = np.random.default_rng(seed)
    experts = [_swiglu_mats(d, i, int(rng.integers(1 << 20))) for _ in range(e)]
    shared = _swiglu_mats(d, cfg.n_shared_experts * i, int(rng.integers(1 << 20)), shared_int4)
    w = {"layers.0.ffn.gate": rng.standard_normal((e, d)).astype(np.float32) * 0.1,
         "layers.0.ffn.gate_bias": rng.standard_normal(e).astype(np.float32) * 0.01}
    for j, m in enumerate(experts):
        w.update(_as_weights(f"layers.0.ffn.experts.{j}", m))
    w.update(_as_weights("layers.0.ffn.shared", shared))
    rt = ops.router(w["layers.0.ffn.gate"], w["layers.0.ffn.gate_bias"], cfg.num_experts_per_tok, cfg.n_group,
                    cfg.topk_group, cfg.norm_topk_prob, cfg.routed_scaling_factor)
    return w, ops.moe_weights(rt, experts, shared)


@pytest.mark.parametrize("preset_name,shared_int4,paths", [
    ("tiny", True, (ops.FUSED_MOE, None)),                  # the shared expert inside fused_moe
    ("tiny", False, (ops.FUSED_MOE, ops.PORTABLE)),         # policy 'experts': FP32 shared expert
    ("tiny2", True, (ops.PORTABLE, ops.PORTABLE))])         # expert width 32
def test_moe_both_paths_match_the_reference(preset_name, shared_int4, paths):
    cfg = replace(preset(preset_name), num_hidden_layers=1, first_k_dense_replace=0)
    rows, live = 3, 3
    w, m = _moe_model(cfg, 3, shared_int4)
    assert (m.path, m.shared.path if m.shared is not None else None) == paths
    sc = ops.Scratch(rows, [], [m])
    sc.reserve(rows)
    x = np.random.default_rng(4).standard_normal((rows, cfg.hidden_size)).astype(np.float32)
    h = zeros((rows, cfg.hidden_size))
    meta = to_device(np.array([0, live, 0, 0, 0, 0, 0, 0], np.int32))
    with sim_speed():
        ops.moe(h, to_device(x), m, sc, meta, rows)
    assert_close(download(head_rows(h, live)), moe(cfg, w, 0, x[:live]), rtol=2e-3, atol_rel=2e-3,
                 what=str(paths))


def test_moe_workspace_must_be_reserved_before_use():
    cfg = replace(preset("tiny"), num_hidden_layers=1, first_k_dense_replace=0)
    _, m = _moe_model(cfg, 1)
    sc = ops.Scratch(4, [], [m])
    sc.reserve(2)
    assert sc.workspace(m.fused, 2).n_tok == 2
    with pytest.raises(KernelInputError, match="reserve"):
        sc.workspace(m.fused, 3)
    with pytest.raises(KernelInputError):
        sc.reserve(5)


@pytest.mark.parametrize("ks", [1, 4])
def test_copy_rows_copies_live_rows_only(ks):
    from kernels_numba.blockops import TPB
    from kernels_numba.tokens import copy_rows_kernel
    src = np.random.default_rng(5).standard_normal((3, 300)).astype(np.float32)
    dst = to_device(np.zeros((3, 300), np.float32))
    meta = to_device(np.array([0, 2, 0, 0, 0, 0, 0, 0], np.int32))
    copy_rows_kernel[3, (TPB, ks), 0](dst, to_device(src), meta)
    got = download(dst)
    assert (got[:2] == src[:2]).all() and (got[2] == 0).all()


def test_a_w16a16_shared_expert_beside_fused_moe_gives_the_bits_of_one_after_it(monkeypatch):
    """K2's layout: INT4 routed experts on fused_moe and a W16A16 shared expert. Beside (on the second
    stream, its rows added in fused_moe's combine) h holds the very bits of running it after fused_moe
    (the same float32 additions in the same order), and both are the reference's MoE block."""
    from numformats.bf16 import bf16
    from workbench.quant.w16a16 import W16A16
    monkeypatch.setattr(ops, "BLAS", True)
    monkeypatch.setattr(ops, "BLAS_MIN_ELEMENTS", 0)
    monkeypatch.setattr(ops, "W16_KERNEL", True)                         # the W16A16 kernel, simulated
    cfg = replace(preset("tiny"), num_hidden_layers=1, first_k_dense_replace=0)
    w, m_int4 = _moe_model(cfg, 11)
    d, i = cfg.hidden_size, cfg.n_shared_experts * cfg.moe_intermediate_size
    rng = np.random.default_rng(12)
    shared = [bf16(rng.standard_normal(s) * 0.1) for s in ((i, d), (i, d), (d, i))]
    names = ("w1", "w3", "w2")
    w = {k: v for k, v in w.items() if not k.startswith("layers.0.ffn.shared.")}    # the INT4 one's out
    w.update({f"layers.0.ffn.shared.{n}": W16A16(s) for n, s in zip(names, shared, strict=True)})
    ex = "layers.0.ffn.experts"
    experts = [tuple(ops.Int4Host(w[f"{ex}.{j}.{n}.packed"], w[f"{ex}.{j}.{n}.scale"]) for n in names)
               for j in range(cfg.n_routed_experts)]
    m = ops.moe_weights(m_int4.router, experts, [ops.Bf16Host(s.bits) for s in shared])
    assert (m.path, m.shared.path) == (ops.FUSED_MOE, ops.W16A16)
    rows, live = 3, 2
    x = rng.standard_normal((rows, d)).astype(np.float32)
    h0 = rng.standard_normal((rows, d)).astype(np.float32)
    meta = to_device(np.array([0, live, 0, 0, 0, 0, 0, 0], np.int32))
    got = {}
    for beside in (True, False):
        monkeypatch.setattr(ops, "SHARED_BESIDE", beside)
        sc = ops.Scratch(rows, [], [m])
        sc.reserve(rows)
        h = to_device(h0.copy())
        with sim_speed():
            ops.moe(h, to_device(x), m, sc, meta, rows)
        got[beside] = download(h)
    np.testing.assert_array_equal(got[True], got[False])
    assert_close(got[True][:live], h0[:live] + moe(cfg, w, 0, x[:live]), rtol=1e-2, atol_rel=1e-2,
                 what="shared beside")


def test_w16a16_products_take_column_tiles_where_they_measured_faster(monkeypatch):
    """``ops.multi_tiles``: NT column tiles a block at 17-24 rows for K >= 2048 only (the H200's side-by-side
    numbers), and a product taking them still gives each row the bits of that row alone."""
    import torch

    import kernels_numba.w16a16 as w16
    from numformats.bf16 import bf16
    monkeypatch.setattr(ops, "W16_KERNEL", True)
    monkeypatch.setattr(w16, "MIN_BLOCKS", 1)                    # NT tiles with a small N
    k, n, t = 2048, 64, 17
    rng = np.random.default_rng(21)
    bits = bf16(rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k)).bits
    where = "cuda" if on_gpu() else "cpu"                           # the weight's device: the kernel's
    w_t = torch.from_numpy(np.ascontiguousarray(bits.T).view(np.int16)).view(torch.bfloat16).to(where)
    dense = ops.dense_w16(w_t)
    assert dense.path == ops.W16A16
    assert [ops.multi_tiles(dense.wt, r) for r in (16, 17, 24, 25)] == [False, True, True, False]
    assert ops.tiles_per_block(dense.wt, ops.row_tiles(t), True) == 4
    narrow = ops.dense_w16(torch.zeros((1536, 16), dtype=torch.bfloat16, device=where))
    assert not ops.multi_tiles(narrow.wt, t)                         # wq_b's K: one tile a block
    x = rng.standard_normal((t, k)).astype(np.float32)
    meta = to_device(np.array([0, t, 0, 0, 0, 0, 0, 0], np.int32))
    out, one = zeros((t, n)), zeros((1, n))
    with sim_speed():
        ops.linear(out, to_device(x), dense, meta, t)
        for r in (0, t - 1):
            ops.linear(one, to_device(x[r:r + 1]), dense, meta, 1)
            np.testing.assert_array_equal(download(one)[0], download(out)[r])


def test_row_kernels_refuse_a_block_past_32_warps_before_launching():
    from kernels_numba.rmsnorm import rmsnorm
    x = to_device(np.ones((2, 64), np.float32))
    meta = to_device(np.array([0, 2, 0, 0, 0, 0, 0, 0], np.int32))
    out = to_device(np.full(2, -1, np.int32))
    for ks in (0, 33):
        with pytest.raises(KernelInputError, match="ks must be 1..32 warps"):
            ops.argmax(out, x, meta, 2, ks=ks)
        with pytest.raises(KernelInputError, match="ks must be 1..32 warps"):
            rmsnorm(x, x, to_device(np.ones(64, np.float32)), 1e-6, meta, 2, ks=ks)
    assert (download(out) == -1).all() and (download(x) == 1).all()


@pytest.mark.parametrize("ks", [None, 3])
def test_argmax_takes_the_lowest_id_of_a_tie_at_any_width(ks):
    """Each row's argmax over V logits, ties to the lowest id (across lanes, warps, and within a thread's
    own keys: a row of one value), for widths that leave a thread's last group of loads partly past V;
    ks = 3: three warps meet after each warp's shuffles."""
    rng = np.random.default_rng(11)
    for v in (37, 1000, 4099):
        logits = rng.standard_normal((4, v)).astype(np.float32)
        logits[1, [5, v - 1]] = 9.0                                        # a tie: id 5 wins
        logits[2, :] = -np.inf
        logits[2, v - 2] = -1.0
        logits[3, :] = 0.5                                                 # every id ties: id 0
        out = to_device(np.full(5, -1, np.int32))
        meta = to_device(np.array([0, 4, 0, 0, 0, 0, 0, 0], np.int32))
        with sim_speed():
            ops.argmax(out, to_device(logits), meta, 4, ks=ks)
        assert download(out)[:4].tolist() == [int(np.argmax(logits[0])), 5, v - 2, 0]


def test_switches_are_read_and_set_by_name(monkeypatch):
    for name in ops.SWITCHES:                                   # undone after the test
        monkeypatch.setattr(ops, name, getattr(ops, name))
    before = ops.switches()
    assert set(before) == set(ops.SWITCHES) and all(isinstance(v, bool) for v in before.values())
    ops.set_switches({"W16_PERSISTENT": not before["W16_PERSISTENT"]})
    assert ops.W16_PERSISTENT is (not before["W16_PERSISTENT"])
    with pytest.raises(KernelInputError, match="unknown kernel switch NOPE"):
        ops.set_switches({"NOPE": True, "W16_FLASH": True})
    assert ops.W16_FLASH is before["W16_FLASH"]                 # nothing set when one name is unknown

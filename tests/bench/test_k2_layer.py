"""The k2_slice layer benchmark's device layer against the reference layer: a small K2-like config in
the simulator (fast path: every K a multiple of 64, 16 experts), the real k2_slice on the GPU tier."""

import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from kernels_numba import ops
from kernels_numba.device import SIMULATED, download, on_gpu, upload
from kernels_numba.sim import sim_speed
from workbench.bench import k2_layer
from workbench.bench.k2_build import layer_bytes
from workbench.config import preset
from workbench.engine.layer import LayerRig
from workbench.engine.scenarios import check_layer

ON_GPU = not SIMULATED and on_gpu()
# K2's structure at small widths: q_lora, 1 dense + 1 MoE layer, top-4 of 16 experts + 1 shared, G = 32
SMALL = preset("k2_slice").replace(
    hidden_size=64, num_attention_heads=1, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16,
    qk_nope_head_dim=16, v_head_dim=16, intermediate_size=128, moe_intermediate_size=64, n_routed_experts=16,
    num_experts_per_tok=4, n_group=1, topk_group=1, vocab_size=256, num_hidden_layers=2)


def _rig(cfg, layer, experts="int4", workers=1, dense="fp32"):
    return LayerRig(cfg, layer, k2_layer.layer(cfg, 3, layer, experts, dense, workers), 17, 24)


@pytest.mark.parametrize("layer", [0, 1])
def test_small_layer_matches_reference(layer):
    rig = _rig(SMALL, layer)
    res = check_layer(SMALL, 3, rig, prefix=4, tree_nodes=16, log=lambda m: None)
    assert [r["rows"] for r in res] == [4, 1, 17]
    assert all(r["passed"] for r in res), res
    if layer == 1:
        assert rig.lay.moe.path == ops.FUSED_MOE and rig.lay.moe.shared.path == ops.PORTABLE
        assert all(r["routes_match"] for r in res[1:])
    else:
        assert rig.lay.mlp.path == ops.PORTABLE


@pytest.mark.parametrize("layer", [0, 1])
def test_small_layer_w16a16_matches_the_reference_w16a16(layer, monkeypatch):
    """Dense projections W16A16 (bf16 GEMMs on the BLAS path) against the reference's W16A16 layer."""
    from workbench.engine.kinds import DenseKind
    monkeypatch.setattr(ops, "BLAS", True)
    rig = _rig(SMALL, layer, dense="bf16")
    assert rig.lay.dense_kind == DenseKind.BF16
    assert rig.lay.a1.path == (ops.W16A16 if ops.W16_KERNEL else ops.BLAS_PATH)   # the kernel on a GPU
    res = check_layer(SMALL, 3, rig, prefix=4, tree_nodes=16, log=lambda m: None)
    assert all(r["passed"] and r["dense"] == "bf16" for r in res), res
    assert max(r["max_rel_err"] for r in res) <= 2e-3            # at these widths few bf16 roundings flip


def test_w16a16_floors_hold_the_weights_and_cache_rows_at_two_bytes():
    cfg = preset("k2_slice")
    lb = layer_bytes(cfg, 1)
    f32, k2 = k2_layer._floor_bytes(cfg, 1, "attention", 1, 4096, 0.0, "int4")
    b16, _ = k2_layer._floor_bytes(cfg, 1, "attention", 1, 4096, 0.0, "int4", "bf16")
    assert f32 - b16 == 2 * lb["attention_params"] + 4097 * (lb["kv_row_fp32"] - lb["kv_row_bf16"])
    assert b16 == k2                                                  # the engine's cache rows are bf16 too
    shared = k2_layer._floor_bytes(cfg, 1, "shared_expert", 1, 0, 0.0, "int4", "bf16")[0]
    assert shared == 2 * lb["shared_params"]


def test_small_fp32_experts_match_reference():
    rig = _rig(SMALL, 1, "fp32")
    assert rig.lay.moe.path == ops.PORTABLE
    res = check_layer(SMALL, 3, rig, prefix=4, tree_nodes=16, log=lambda m: None)
    assert all(r["passed"] for r in res), res


def test_small_k2_layout_layer_matches_reference(monkeypatch):
    """K2's layout at small widths: INT4 routed experts on fused_moe, the rest W16A16 on the W16A16 kernel
    (simulated), so the shared expert runs beside the routed experts (``ops.shares_beside``)."""
    monkeypatch.setattr(ops, "BLAS", True)
    monkeypatch.setattr(ops, "BLAS_MIN_ELEMENTS", 0)
    monkeypatch.setattr(ops, "W16_KERNEL", True)
    rig = _rig(SMALL, 1, dense="bf16")
    assert ops.shares_beside(rig.lay.moe) and ops.SHARED_BESIDE
    res = check_layer(SMALL, 3, rig, prefix=4, tree_nodes=16, log=lambda m: None)
    assert all(r["passed"] and r["dense"] == "bf16" for r in res), res


def test_a_wrong_weight_fails_the_check():
    rig = _rig(SMALL, 1)
    upload(rig.lay.ffn_norm, download(rig.lay.ffn_norm) * np.float32(1.01))  # ffn_norm 1% off on the device
    res = check_layer(SMALL, 3, rig, prefix=4, tree_nodes=4, log=lambda m: None)
    assert not all(r["passed"] for r in res[1:])


@pytest.mark.parametrize("experts", ["int4", "bf16"])
def test_parts_launch_and_floors(experts, monkeypatch):
    monkeypatch.setattr(ops, "BLAS", True)                     # the bf16 experts' grouped GEMMs
    rig = _rig(SMALL, 1, experts)
    n = 3
    rig.load(np.ones((n, SMALL.hidden_size), np.float32), 4, np.array([0, 1, 1]), np.tril(np.ones((n, n))))
    with sim_speed():
        rig.step(n)
        for own in (False, True):
            parts = rig.parts(n, own_routing=own, moe_block=True)
            assert list(parts) == ["attention", "router", "routed_experts", "shared_expert", "moe_block",
                                   "layer"]
            assert "moe_block" not in rig.parts(n, own_routing=own)
            for fn in parts.values():
                fn(0)
        outs = []
        for _ in range(2):                       # the layer part from its restored input rows: alike
            rig.reset("layer", n)
            parts["layer"](0)
            outs.append(rig.out(n))
    assert np.isfinite(outs[0]).all() and np.array_equal(outs[0], outs[1])
    lb = layer_bytes(preset("k2_slice"), 1)
    assert lb["expert_int4"] == 3 * 7168 * 2048 // 2 + 3 * 7168 * 64 * 2        # 24.77 MB
    assert lb["expert_bf16"] == 3 * 7168 * 2048 * 2                             # 88.1 MB
    assert round(k2_layer.union_model(384, 8, 16)) == 110


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="GPU tier: needs KDTREE_GPU=1 and a CUDA GPU")
@pytest.mark.parametrize("layer", [0, 1, 2])
def test_k2_slice_layer_matches_reference_on_gpu(layer):
    cfg = preset("k2_slice")
    rig = LayerRig(cfg, layer, k2_layer.layer(cfg, 0, layer, "int4", workers=16), 17, 40)
    res = check_layer(cfg, 0, rig, prefix=16, tree_nodes=16)
    assert all(r["passed"] for r in res), res


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="GPU tier: needs KDTREE_GPU=1 and a CUDA GPU")
@pytest.mark.parametrize("layer", [0, 1])
def test_k2_slice_layer_w16a16_matches_reference_on_gpu(layer):
    """The real k2_slice with W16A16 dense projections and attention (cuBLAS bf16 GEMMs)."""
    cfg = preset("k2_slice")
    rig = LayerRig(cfg, layer, k2_layer.layer(cfg, 0, layer, "int4", "bf16", 16), 17, 40)
    res = check_layer(cfg, 0, rig, prefix=16, tree_nodes=16)
    assert all(r["passed"] and r["dense"] == "bf16" for r in res), res


@pytest.mark.parametrize("dense", ["fp32", "bf16"])
def test_small_layer_bf16_experts_match_the_reference(dense, monkeypatch):
    """BF16 experts on grouped GEMMs (the bf16 layout's values, W16A16 with bf16 outputs) against the
    reference layer with those experts marked."""
    monkeypatch.setattr(ops, "BLAS", True)
    rig = _rig(SMALL, 1, "bf16", dense=dense)
    assert rig.lay.moe.path == ops.GROUPED_MM
    res = check_layer(SMALL, 3, rig, prefix=4, tree_nodes=16, log=lambda m: None)
    assert [r["rows"] for r in res] == [4, 1, 17]
    assert all(r["passed"] and r["experts"] == "bf16" for r in res), res
    assert max(r["max_rel_err"] for r in res) <= 2e-3            # a missing bf16 rounding shows ~3e-3


def test_reference_workers_start_with_the_blas_thread_limit():
    before = os.environ.get("OPENBLAS_NUM_THREADS")
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        with k2_layer._blas_threads(3):
            seen = pool.submit(os.getenv, "OPENBLAS_NUM_THREADS")    # the worker is spawned here
        assert seen.result() == "3"
    assert os.environ.get("OPENBLAS_NUM_THREADS") == before


@pytest.mark.parametrize("experts, dense",
                         [("int4", "fp32"), ("fp32", "fp32"), ("bf16", "bf16"), ("int4", "bf16")])
def test_a_built_layer_records_the_kinds_it_runs(experts, dense, monkeypatch):
    from workbench.engine.kinds import DenseKind, ExpertKind
    monkeypatch.setattr(ops, "BLAS", True)
    moe, mlp = k2_layer.layer(SMALL, 3, 1, experts, dense), k2_layer.layer(SMALL, 3, 0, experts, dense)
    assert (moe.expert_kind, moe.dense_kind) == (ExpertKind(experts), DenseKind(dense))
    assert (mlp.expert_kind, mlp.dense_kind) == (None, DenseKind(dense))
    assert moe.moe.path == {"int4": ops.FUSED_MOE, "fp32": ops.PORTABLE, "bf16": ops.GROUPED_MM}[experts]


def test_unknown_kinds_are_input_errors():
    from workbench.errors import InputError
    for experts, dense in (("int8", "fp32"), ("int4", "fp16")):
        with pytest.raises(InputError, match="must be one of"):
            k2_layer.layer(SMALL, 3, 1, experts, dense)
    with pytest.raises(InputError, match="outside the model"):
        k2_layer.layer(SMALL, 3, 2)


def test_ep_whole_layer_is_the_built_layers_moe():
    """``bench ep``'s one-GPU baseline (``ep_layer.whole_layer``, through the builder) computes what the
    built layer's MoE computes, and its routed experts alone (as the ranks-in-turn part runs them) that
    less the shared expert."""
    from kernels_numba.device import download, to_device
    from workbench.bench.ep_layer import whole_layer
    from workbench.engine.build import SeededSource, int4_experts
    src = SeededSource(SMALL, 3)
    lay = k2_layer.layer(SMALL, 3, 1)
    x = np.random.default_rng(0).standard_normal((5, SMALL.hidden_size)).astype(np.float32)
    meta = to_device(np.array([0, 5, 0, 0, 0, 0, 0, 0], np.int32))

    def run(m, sc):
        sc.reserve(5)
        h = to_device(np.zeros_like(x))
        with sim_speed():
            ops.moe(h, to_device(x), m, sc, meta, 5)
        return download(h)
    want = run(lay.moe, ops.Scratch(5, [], [lay.moe]))
    np.testing.assert_allclose(run(*whole_layer(src, 1, 5)), want, rtol=1e-6, atol=1e-6)
    m, sc = whole_layer(src, 1, 5, fused=int4_experts(SMALL, 3, 1))
    m = ops.moe_fused(m.router, m.fused)
    alone = lay.moe.shared
    h = to_device(np.zeros_like(x))
    with sim_speed():
        ops.swiglu(h, to_device(x), alone, ops.Scratch(5, [alone], []), meta, 5)
    np.testing.assert_allclose(run(m, sc) + download(h), want, rtol=1e-5, atol=1e-5)

"""The device router against workbench.reference.moe.moe_gate: ids (ties to the lowest index) and
weights, with and without the group limit and normalisation."""

import numpy as np
import pytest

from kernels_numba.blockops import TPB
from kernels_numba.device import download, to_device, zeros
from kernels_numba.router import make_route
from workbench.config import preset
from workbench.reference.moe import moe_gate

GROUPED = dict(n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3)


@pytest.mark.parametrize("changes,ks,from_logits", [
    ({}, 1, False), ({}, 4, False), (GROUPED, 2, False), (dict(norm_topk_prob=False), 1, False),
    (dict(n_routed_experts=96, num_experts_per_tok=8), 2, True)])   # more experts than threads; whole logits
def test_route_kernel_matches_moe_gate(changes, ks, from_logits):
    cfg = preset("tiny").replace(**changes)
    rng = np.random.default_rng(len(changes))
    s, d, e, k = 5, cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok
    x = rng.standard_normal((s, d)).astype(np.float32)
    gate = (rng.standard_normal((e, d)) / np.sqrt(d)).astype(np.float32)
    bias = (rng.standard_normal(e) * 0.1).astype(np.float32)
    bias[1] = bias[0]                                                    # ties in selection
    gate[1] = gate[0]
    ids, wts = zeros((s, k), np.int32), zeros((s, k), np.float32)
    route = make_route(e, k, cfg.n_group, cfg.topk_group, cfg.norm_topk_prob, cfg.routed_scaling_factor, ks,
                       slices=int(from_logits))
    gate_t = to_device(np.ascontiguousarray(gate.T))
    inp = to_device(x @ gate.T) if from_logits else to_device(x)
    meta = to_device(np.array([0, s, 0, 0, 0, 0, 0, 0], np.int32))
    route[s, (TPB, ks), 0](ids, wts, inp, gate_t, to_device(bias), meta)
    want_ids, want_w = moe_gate(cfg, x, gate, bias)
    np.testing.assert_array_equal(download(ids), want_ids)
    np.testing.assert_allclose(download(wts), want_w, rtol=1e-5, atol=1e-6)


def test_sliced_router_matches_moe_gate_and_each_row_alone():
    """A gate of two slices with a short second one (D = 640 = 512 + 128), 11 rows (two passes of 8, the
    second short): the reference's choice, and the first and last rows' ids and weights bit for bit
    those of the row routed alone (a verify's row routes as a one-row decode does); with ``x16`` the
    float16 of the live rows beside (rounding to nearest even, as numpy's)."""
    from kernels_numba import ops
    from kernels_numba.sim import sim_speed
    from tests.engine.common import blas_on
    cfg = preset("tiny").replace(hidden_size=640, n_routed_experts=40, num_experts_per_tok=4)
    rng = np.random.default_rng(3)
    d, e, k, n = cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok, 11
    x = rng.standard_normal((n, d)).astype(np.float32)
    gate = (rng.standard_normal((e, d)) / np.sqrt(d)).astype(np.float32)
    bias = (rng.standard_normal(e) * 0.1).astype(np.float32)
    with blas_on(min_elements=1), sim_speed():
        rt = ops.router(gate, bias, k, cfg.n_group, cfg.topk_group, cfg.norm_topk_prob,
                        cfg.routed_scaling_factor)
        assert (rt.path, rt.slices) == (ops.SLICED, 2)
        sc = ops.Scratch(n, [], [], routers=(rt,))
        x16 = to_device(np.zeros((n, d), np.uint16))
        ops.route(sc.rids, sc.rwts, to_device(x), rt, sc, to_device(np.array([0, n - 1, 0, 0, 0, 0, 0, 0],
                                                                             np.int32)), n, x16=x16)
        got16 = download(x16)                                       # f16(x) of the live rows, written as read
        assert np.array_equal(got16[:n - 1], x[:n - 1].astype(np.float16).view(np.uint16))
        assert not got16[n - 1].any()
        out = []
        for rows in (x, x[:1], x[-1:]):
            t = len(rows)
            ops.route(sc.rids, sc.rwts, to_device(rows), rt, sc,
                      to_device(np.array([0, t, 0, 0, 0, 0, 0, 0], np.int32)), t)
            out.append((download(sc.rids)[:t].copy(), download(sc.rwts)[:t].copy()))
    want_ids, want_w = moe_gate(cfg, x, gate, bias)
    np.testing.assert_array_equal(out[0][0], want_ids)
    np.testing.assert_allclose(out[0][1], want_w, rtol=1e-5, atol=1e-6)
    for alone, i in ((out[1], 0), (out[2], n - 1)):
        np.testing.assert_array_equal(alone[0][0], out[0][0][i])
        np.testing.assert_array_equal(alone[1][0], out[0][1][i])


def test_only_a_sliced_router_writes_f16_of_x():
    from kernels_numba import KernelInputError, ops
    cfg = preset("tiny")
    e, d = cfg.n_routed_experts, cfg.hidden_size
    rt = ops.router(np.ones((e, d), np.float32), np.zeros(e, np.float32), 2, 1, 1, True, 1.0, fast=False)
    assert rt.path == ops.PORTABLE
    sc = ops.Scratch(1, [], [], routers=(rt,))
    with pytest.raises(KernelInputError, match="only a sliced router"):
        ops.route(sc.rids, sc.rwts, to_device(np.ones((1, d), np.float32)), rt, sc,
                  to_device(np.array([0, 1, 0, 0, 0, 0, 0, 0], np.int32)), 1, x16=zeros((1, d), np.uint16))

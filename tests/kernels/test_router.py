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
    (dict(n_routed_experts=96, num_experts_per_tok=8), 2, True)])   # more experts than threads; SGEMM logits
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
                       from_logits=from_logits)
    gate_t = to_device(np.ascontiguousarray(gate.T))
    inp = to_device(x @ gate.T) if from_logits else to_device(x)
    meta = to_device(np.array([0, s, 0, 0, 0, 0, 0, 0], np.int32))
    route[s, (TPB, ks), 0](ids, wts, inp, gate_t, to_device(bias), meta)
    want_ids, want_w = moe_gate(cfg, x, gate, bias)
    np.testing.assert_array_equal(download(ids), want_ids)
    np.testing.assert_allclose(download(wts), want_w, rtol=1e-5, atol=1e-6)

"""The expert-parallel split run rank after rank on one device (workbench.parallel.in_turn): every rank's
share of a step, run and combined, equals the routed experts of the numpy reference (W4A16 definition);
in the simulator (CI) and on the GPU tier."""

import numpy as np
import pytest

from kernels_numba import ops
from kernels_numba.sim import sim_speed
from workbench.config import ConfigError
from workbench.errors import InputError
from workbench.parallel.experts import ExpertSplit
from workbench.parallel.in_turn import combine, run, shares
from workbench.reference.moe import moe, moe_gate

from ..kernels.helpers import assert_close
from .common import CFG, DEVICE, LAYER, _swiglu, router, weights

SEED = 7
TOL = 2e-3        # as the block's tests: a rank's row count can change fused_moe's summation order


def _layer(w):
    p = f"layers.{LAYER}.ffn"
    experts = [_swiglu(w, f"{p}.experts.{j}") for j in range(CFG.n_routed_experts)]
    m = ops.moe_weights(router(w), experts, None)
    assert m.path == ops.FUSED_MOE and m.fused.n_shared == 0
    return m.fused


@pytest.mark.parametrize("world,rows", [(1, 3), (2, 9), (4, 1), (16, 5)])     # P = 16: one expert a rank
def test_shares_combined_equal_the_routed_experts(world, rows):
    import torch
    w = weights(SEED)
    x = np.random.default_rng(world * 100 + rows).standard_normal((rows, CFG.hidden_size)).astype(np.float32)
    p = f"layers.{LAYER}.ffn"
    idx, wts = moe_gate(CFG, x, w[p + ".gate"], w[p + ".gate_bias"])
    split = ExpertSplit(CFG.n_routed_experts, world)
    step = (torch.from_numpy(a).to(DEVICE) for a in (x, idx.astype(np.int32), wts.astype(np.float32)))
    parts = shares(*step, _layer(w), split)
    el = split.per_rank
    assert [len(s.rows) for s in parts] == [int((idx // el == q).any(1).sum()) for q in range(world)]
    assert [s.distinct for s in parts] == [len(np.unique(idx[idx // el == q])) for q in range(world)]
    most = [int((idx // el == q).sum(1).max()) for q in range(world)]        # live slots: the most a row has
    assert [s.ids.shape[1] for s in parts] == most and all(s.ids.shape[1] <= min(CFG.num_experts_per_tok, el)
                                                           for s in parts)
    with sim_speed():
        for s in parts:
            run(s)
    want = moe(CFG.replace(n_shared_experts=0), w, LAYER, x)
    assert_close(combine(parts, rows).cpu().numpy(), want, rtol=TOL, atol_rel=TOL, what=f"P={world} T={rows}")


def test_bad_inputs_raise_one_line_errors():
    import torch
    w = weights(SEED)
    full = _layer(w)
    x, ids = torch.zeros(2, CFG.hidden_size), torch.zeros(2, CFG.num_experts_per_tok, dtype=torch.int32)
    with pytest.raises(ConfigError, match="split is of 32"):
        shares(x, ids, ids.float(), full, ExpertSplit(32, 2))
    with pytest.raises(InputError, match="float32"):
        shares(x[:, :64], ids, ids.float(), full, ExpertSplit(CFG.n_routed_experts, 2))

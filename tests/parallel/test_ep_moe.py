"""The expert-parallel MoE block on 1, 2 and 4 processes (gloo with the kernels in the CUDA simulator, or
NCCL on the GPU tier) equals the single-process ops.moe and the numpy reference (W4A16 definition), for
decode and tree verifies."""

import os

import numpy as np
import pytest

from kernels_numba.device import SIMULATED
from workbench.parallel.launch import run_ranks
from workbench.reference.moe import moe, moe_gate

from ..kernels.helpers import assert_close
from .common import BACKEND, CFG, LAYER, single_process, weights, worlds

SEED = 5
# h = silu(gate) * up is rounded to float16 before the down projection; fused_moe picks its GEMV or
# stream-K path by row count, and a rank sees fewer rows than one process, so a summation-order change
# can move an element of h by one f16 ulp (2^-11): the tolerance of the fused_moe tests, 2e-3
TOL = 2e-3


def _cases(world: int, rng) -> list:
    d, last = CFG.hidden_size, tuple(range(CFG.n_routed_experts - CFG.n_routed_experts // world,
                                           CFG.n_routed_experts))
    shapes = [("decode", 1, ()), ("verify 17 rows (16-node tree + root)", 17, ())] if world == 4 else \
        [("decode", 1, ()), ("verify 9 rows", 9, ())]
    if world > 1:
        shapes.append((f"verify 9 rows, rank {world - 1}'s experts never chosen", 9, last))
    return [{"name": n, "banned": b, "x": rng.standard_normal((t, d)).astype(np.float32),
             "h": rng.standard_normal((t, d)).astype(np.float32)} for n, t, b in shapes]


@pytest.mark.parametrize("world", worlds(1, 2, 4))
def test_expert_parallel_equals_one_process(world):
    assert (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1") == SIMULATED     # the ranks inherit the tier
    cases = _cases(world, np.random.default_rng(world))
    per_rank = run_ranks("tests.parallel.common:rank_main", world, (SEED, cases), backend=BACKEND,
                         timeout_s=240)
    for j, c in enumerate(cases):
        got = [r[j]["h"] for r in per_rank]
        for g in got[1:]:                      # every rank adds the same gathered rows to the same h
            np.testing.assert_array_equal(g, got[0])
        w = weights(SEED, c["banned"])
        what = f"P={world} {c['name']}"
        assert_close(got[0], single_process(w, c["h"], c["x"]), rtol=TOL, atol_rel=TOL,
                     what=what + " vs ops.moe")
        assert_close(got[0] - c["h"], moe(CFG, w, LAYER, c["x"]), rtol=TOL, atol_rel=TOL,
                     what=what + " vs reference")
        assert per_rank[0][j]["phases"] == sorted(["router", "dispatch", "local_moe", "combine", "shared",
                                                   "gather", "total"])
        idx, _ = moe_gate(CFG, c["x"], w[f"layers.{LAYER}.ffn.gate"], w[f"layers.{LAYER}.ffn.gate_bias"])
        el = CFG.n_routed_experts // world           # each row once per rank holding one of its experts
        want = [int((idx // el == q).any(1).sum()) for q in range(world)]
        assert [sum(r[j]["got"]) for r in per_rank] == want
        if c["banned"]:
            assert sum(per_rank[-1][j]["got"]) == 0, "the last rank should receive no row"

"""The expert-parallel stack (workbench.parallel.ep_stack) on 1, 2 and 4 processes (gloo with the kernels
in the CUDA simulator, or NCCL on the GPU tier): a whole forward of 1 dense + 2 MoE layers (MLA with the
latent cache, INT4 experts) for a prefill, decode steps and a tree verify gives every rank the same
logits, equal to the single-process engine's, and the same greedy tokens."""

import numpy as np
import pytest

from workbench.config import ConfigError
from workbench.engine.runtime import Engine
from workbench.parallel.ep_stack import ep_engine
from workbench.parallel.launch import run_ranks

from ..kernels.helpers import assert_close
from .common import BACKEND, BUDGET, PROMPT, STACK_CFG, stack_steps, stack_weights, worlds

SEED = 11
# each MoE layer's fused_moe sees fewer rows per rank than on one process, so its summation order can
# change and move a float16 activation by one ulp: the layer tests' 2e-3 (relative to each element plus
# 2e-3 of the largest); measured here ~3e-7 of the largest logit (no activation moved)
TOL = 2e-3


@pytest.fixture(scope="module")
def single():
    eng = Engine(STACK_CFG, stack_weights(SEED), max_len=len(PROMPT) + 16,
                 max_rows=max(len(PROMPT), BUDGET + 1))
    assert [p.get("experts") for p in eng.model.paths()] == [None, "fused_moe", "fused_moe"]
    return stack_steps(eng, SEED)


@pytest.mark.parametrize("world", worlds(1, 2, 4, slow=(4,)))     # P = 4: ~12 s more
def test_expert_parallel_stack_equals_one_process(world, single):
    per_rank = run_ranks("tests.parallel.common:stack_rank", world, (SEED,), backend=BACKEND, timeout_s=240)
    tree = single["tree"]
    assert tree.shape[1] == BUDGET + 1 and (np.bincount(tree[2, 1:] + 1) > 1).any()   # siblings: not a chain
    for k in ("logits", "prefill", "verify"):
        top2 = np.sort(single[k], axis=1)[:, -2:]
        assert (top2[:, 1] - top2[:, 0] > 4 * TOL * np.abs(single[k]).max()).all(), "a greedy tie: new seed"
    for r, got in enumerate(per_rank):
        what = f"P={world} rank {r}"
        np.testing.assert_array_equal(got["tree"], tree, err_msg=what)
        for k in ("logits", "prefill", "verify"):
            np.testing.assert_array_equal(got[k], per_rank[0][k], err_msg=f"{what} {k} vs rank 0")
            assert_close(got[k], single[k], rtol=TOL, atol_rel=TOL, what=f"{what} {k} vs one process")
        np.testing.assert_array_equal(got["tokens"], single["tokens"], err_msg=what)
        np.testing.assert_array_equal(got["post"], single["post"], err_msg=what)
    assert sum(r["received"][1] for r in per_rank) >= BUDGET + 1      # the verify's rows reached the experts


def test_needs_a_process_group():
    with pytest.raises(ConfigError, match="process group"):
        ep_engine(STACK_CFG, {}, max_len=8, max_rows=4)

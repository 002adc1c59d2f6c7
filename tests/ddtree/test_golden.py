"""Reference DDTree on the golden bundles (refs/*.kdtr): greedy DDTree reproduces the golden tokens for
budgets 1, 4, 16 (and 64 on tiny) with both drafters, and oracle p = 1 accepts a full path every round."""

import functools
from pathlib import Path

import numpy as np
import pytest

from workbench.bundle import read_bundle
from workbench.ddtree import DrafterConfig, ddtree_generate

REFS = Path(__file__).resolve().parents[2] / "refs"
NAMES = ("tiny", "tiny2", "int4_tiny", "int4_tiny2")
N = 24                        # golden tokens checked; the oracle knows all of them (>= N + L)


@functools.cache
def bundle(name):
    b = read_bundle(REFS / f"{name}.kdtr")
    return b, b.weights(), DrafterConfig.from_dict(b.meta["drafter"])


# budget 64 runs the same numpy code as 16 on larger trees, 8-30 s a bundle with the DFlash drafter:
# once (tiny, both drafters) is enough
CASES = [(n, b, d) for n in NAMES for b in (1, 4, 16, 64) for d in ("dflash", "oracle")
         if b < 64 or n == "tiny"]


@pytest.mark.parametrize("name,budget,drafter", CASES)
def test_reference_ddtree_matches_golden(name, budget, drafter):
    b, weights, dcfg = bundle(name)
    assert len(b.golden) >= N + dcfg.n_drafted
    res = ddtree_generate(b.config, weights, b.prompt, N, drafter, budget, drafter_config=dcfg,
                          oracle_p=0.8, continuation=b.golden)
    np.testing.assert_array_equal(res.tokens, b.golden[:N])


@pytest.mark.parametrize("name", NAMES)
def test_oracle_p1_full_acceptance_on_golden(name):
    b, weights, dcfg = bundle(name)
    res = ddtree_generate(b.config, weights, b.prompt, N, "oracle", 16, drafter_config=dcfg, oracle_p=1.0,
                          continuation=b.golden)
    np.testing.assert_array_equal(res.tokens, b.golden[:N])
    assert [r.accepted_len for r in res.rounds] == [dcfg.block_size] * len(res.rounds)

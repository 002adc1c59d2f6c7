"""The plain DFlash chain on the reference: greedy equals greedy AR with either drafter and either
drafter layout, every round verifies the L argmax tokens as one path, its accepted lengths are the
ones ``measure`` reports as the chain's, and ``generate(mode="chain")`` runs it."""

import numpy as np
import pytest

from tests.ddtree.common import N_TOKENS, PROMPT, dflash_model, greedy, model
from workbench.ddtree import SamplingParams
from workbench.ddtree.chain import chain_generate, chain_tree
from workbench.errors import InputError
from workbench.generate import generate
from workbench.train.measure import Pair, speculate


@pytest.mark.parametrize("drafter", ["dflash", "public", "oracle"])
def test_greedy_chain_equals_greedy_ar(preset_name, drafter):
    cfg, weights, dcfg = dflash_model(preset_name) if drafter == "public" else model(preset_name)
    ar = greedy(preset_name, N_TOKENS + dcfg.n_drafted)
    res = chain_generate(cfg, weights, PROMPT, N_TOKENS, "oracle" if drafter == "oracle" else "dflash",
                         drafter_config=dcfg, oracle_p=0.7, continuation=ar.tokens)
    np.testing.assert_array_equal(res.tokens, ar.tokens[:N_TOKENS])
    assert all(r.tree_size == r.depth == dcfg.n_drafted and 1 <= r.accepted_len <= dcfg.block_size
               for r in res.rounds)
    made = 1 + np.cumsum([r.accepted_len for r in res.rounds])
    assert made[-1] >= N_TOKENS and (len(made) == 1 or made[-2] < N_TOKENS)


def test_chain_tree_is_the_argmax_path():
    logits = np.random.default_rng(0).standard_normal((5, 40))
    t = chain_tree(logits)
    assert t.tokens.tolist() == logits.argmax(-1).tolist() and t.parents.tolist() == [-1, 0, 1, 2, 3, 4]
    assert t.depth == 5 and t.child_maps[2] == {int(t.tokens[2]): 3}


def test_oracle_p1_chain_accepts_the_whole_block():
    cfg, weights, dcfg = model("tiny")
    res = chain_generate(cfg, weights, PROMPT, 20, "oracle", drafter_config=dcfg, oracle_p=1.0,
                         continuation=greedy("tiny", 20 + dcfg.n_drafted).tokens)
    assert [r.accepted_len for r in res.rounds[:-1]] == [dcfg.block_size] * (len(res.rounds) - 1)


def test_chain_accepted_lengths_equal_measures_chain():
    cfg, weights, dcfg = dflash_model("tiny")
    run = speculate(Pair(cfg, weights, dcfg, None, "tiny"), PROMPT, N_TOKENS, dcfg.n_drafted, "chain")
    res = chain_generate(cfg, weights, PROMPT, N_TOKENS, "dflash", drafter_config=dcfg)
    assert [r.accepted_len for r in res.rounds] == run.accepted
    np.testing.assert_array_equal(res.tokens, run.tokens)


def test_generate_chain_mode_and_sampling():
    cfg, weights, dcfg = model("tiny2")
    g = generate(cfg, weights, PROMPT, 10, mode="chain", drafter_config=dcfg)
    np.testing.assert_array_equal(g.tokens, greedy("tiny2", 10).tokens)
    assert g.rounds and g.mean_accepted == np.mean([r.accepted_len for r in g.rounds])
    s = SamplingParams(1.0, 3)
    a, b = (generate(cfg, weights, PROMPT, 10, mode="chain", drafter_config=dcfg, sampling=s) for _ in "ab")
    np.testing.assert_array_equal(a.tokens, b.tokens)                   # seeded: reproducible
    with pytest.raises(InputError, match="mode"):
        generate(cfg, weights, PROMPT, 4, mode="tree")

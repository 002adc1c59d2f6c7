"""The reference DDTree loop: one-pass tree verify, KV commit, greedy equality with AR, oracle acceptance."""

import numpy as np
import pytest

from tests.ddtree.common import N_TOKENS, PROMPT, greedy, model
from workbench.ddtree import SamplingParams, ddtree_generate
from workbench.ddtree.config import GREEDY
from workbench.ddtree.oracle import oracle_logits
from workbench.ddtree.sampling import make_rng, sample_tokens
from workbench.ddtree.speculative import commit, prefill, verify
from workbench.ddtree.tree import build_tree, compile_tree
from workbench.ddtree.walk import walk
from workbench.reference.model import LatentCache, forward


class RunnerUpDrafter:
    """Puts a wrong token on top and the true one second (0.5 below) at every position: the walk then
    accepts siblings, so accepted paths are not a prefix of the heap order and the commit must move rows."""

    def __init__(self, sequence, vocab, block_size, capture=()):
        self.sequence, self.vocab, self.block_size, self.capture = sequence, vocab, block_size, capture

    def propose(self, state):
        logits = oracle_logits(self.sequence, self.vocab, state.start, self.block_size - 1, 0.0, seed=1)
        for i in range(self.block_size - 1):
            if state.start + 1 + i < len(self.sequence):
                logits[i, self.sequence[state.start + 1 + i]] = logits[i].max() - 0.5
        return logits


def _prefilled(cfg, weights, dtype, extra):
    cache = LatentCache.empty(cfg, len(PROMPT) + extra, dtype)
    forward(cfg, weights, PROMPT, cache, dtype=dtype)
    return cache


def test_tree_verify_equals_sequential_paths(preset_name):
    # each node's logits and tapped hidden states from the one-pass tree forward equal a plain causal
    # pass over the node's root-to-node path on the same committed prefix (float64)
    cfg, weights, dcfg = model(preset_name)
    capture = dcfg.target_layer_ids
    draft = oracle_logits(PROMPT, cfg.vocab_size, len(PROMPT), 5, 0.0, seed=3)     # [5, V], random tops
    draft[:, :8] += 3.0                                                             # spread the tree
    tree = build_tree(draft, 24)
    assert tree.depth >= 3 and tree.n_nodes == 24 and len(tree.child_maps[0]) >= 2
    root = 7
    ids, pos, vis = compile_tree(tree, root, len(PROMPT))
    cache = _prefilled(cfg, weights, np.float64, tree.n_nodes + 1)
    out = forward(cfg, weights, ids, cache, positions=pos, visibility=vis, capture=capture, dtype=np.float64)
    for i in range(tree.n_nodes + 1):
        path = [i]
        while path[-1] != 0:
            path.append(int(tree.parents[path[-1]]))
        path = path[::-1]                                                          # root .. i
        seq_cache = _prefilled(cfg, weights, np.float64, len(path))
        ref = forward(cfg, weights, ids[path], seq_cache, capture=capture, dtype=np.float64)
        np.testing.assert_allclose(out.logits[i], ref.logits[-1], rtol=1e-10, atol=1e-10)
        for k in capture:
            np.testing.assert_allclose(out.hidden[k][i], ref.hidden[k][-1], rtol=1e-10, atol=1e-10)


def test_commit_leaves_the_sequential_cache(preset_name):
    # after several rounds, the compacted latent cache equals a causal prefill of prompt + committed tokens
    cfg, weights, dcfg = model(preset_name)
    dt = np.float64
    sequence = np.concatenate([PROMPT, greedy(preset_name, 16 + dcfg.n_drafted).tokens])
    drafter = RunnerUpDrafter(sequence, cfg.vocab_size, dcfg.block_size, dcfg.target_layer_ids)
    rng = make_rng(GREEDY)
    state = prefill(cfg, weights, PROMPT, len(PROMPT) + 40, drafter, GREEDY, rng, dt)
    moved = 0
    for _ in range(4):
        tree = build_tree(drafter.propose(state), 12)
        logits, hidden = verify(cfg, weights, state, tree, drafter.capture, dt)
        accepted, bonus = walk(tree, sample_tokens(logits, GREEDY, rng))
        moved += accepted != list(range(len(accepted)))
        commit(state, tree, accepted, bonus, hidden, drafter.capture)
    assert state.cache.length == state.start == len(PROMPT) + len(state.tokens) - 1
    assert moved >= 2                                                              # rows really were moved
    seq = LatentCache.empty(cfg, state.start, dt)
    ref = forward(cfg, weights, np.concatenate([PROMPT, state.tokens[:-1]]), seq,
                  capture=dcfg.target_layer_ids, dtype=dt)
    for a, b in zip(state.cache.layers, seq.layers, strict=True):
        np.testing.assert_allclose(a[:state.start], b, rtol=1e-10, atol=1e-10)
    n = state.rounds[-1].accepted_len                                              # features for the drafter
    want = np.concatenate([ref.hidden[k][-n:] for k in dcfg.target_layer_ids], axis=-1)
    np.testing.assert_allclose(state.new_features, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("drafter", ["dflash", "oracle", "runner_up"])
@pytest.mark.parametrize("budget", [1, 4, 16, 64])
def test_greedy_ddtree_equals_greedy_ar(preset_name, drafter, budget):
    cfg, weights, dcfg = model(preset_name)
    ar = greedy(preset_name, N_TOKENS + dcfg.n_drafted)
    if drafter == "runner_up":
        drafter = RunnerUpDrafter(np.concatenate([PROMPT, ar.tokens]), cfg.vocab_size, dcfg.block_size)
    res = ddtree_generate(cfg, weights, PROMPT, N_TOKENS, drafter, budget, drafter_config=dcfg,
                          oracle_p=0.8, continuation=ar.tokens)
    np.testing.assert_array_equal(res.tokens, ar.tokens[:N_TOKENS])
    assert all(1 <= r.tree_size <= budget and 1 <= r.accepted_len <= r.depth + 1 for r in res.rounds)
    made = 1 + np.cumsum([r.accepted_len for r in res.rounds])                   # tokens after each round
    assert made[-1] >= N_TOKENS and (len(made) == 1 or made[-2] < N_TOKENS)


@pytest.mark.parametrize("budget", [1, 3, 16, 64])
def test_oracle_p1_accepts_full_depth_every_round(preset_name, budget):
    cfg, weights, dcfg = model(preset_name)
    res = ddtree_generate(cfg, weights, PROMPT, 20, "oracle", budget, drafter_config=dcfg, oracle_p=1.0,
                          continuation=greedy(preset_name, 20 + dcfg.n_drafted).tokens)
    np.testing.assert_array_equal(res.tokens, greedy(preset_name, 20).tokens)
    assert [r.accepted_len for r in res.rounds] == [r.depth + 1 for r in res.rounds]
    assert all(r.depth == min(budget, dcfg.n_drafted) for r in res.rounds)       # margin 4 keeps the chain


def test_one_token_needs_no_round():
    cfg, weights, dcfg = model("tiny")
    res = ddtree_generate(cfg, weights, PROMPT, 1, "dflash", 4, drafter_config=dcfg)
    assert res.tokens.tolist() == greedy("tiny", 1).tokens.tolist() and res.rounds == []


def test_oracle_p0_rarely_accepts():
    cfg, weights, dcfg = model("tiny")
    res = ddtree_generate(cfg, weights, PROMPT, 12, "oracle", 1, drafter_config=dcfg, oracle_p=0.0)
    np.testing.assert_array_equal(res.tokens, greedy("tiny", 12).tokens)
    assert all(r.accepted_len == 1 for r in res.rounds)        # budget 1: only the (always wrong) top token


def test_dflash_float64_and_sampling_run():
    cfg, weights, dcfg = model("tiny2")
    res = ddtree_generate(cfg, weights, PROMPT, 10, "dflash", 8, SamplingParams(1.0, 5), np.float64,
                          drafter_config=dcfg.to_dict())
    again = ddtree_generate(cfg, weights, PROMPT, 10, "dflash", 8, SamplingParams(1.0, 5), np.float64,
                            drafter_config=dcfg.to_dict())
    assert res.tokens.shape == (10,) and np.array_equal(res.tokens, again.tokens)   # seeded: reproducible

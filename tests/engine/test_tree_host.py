"""The engine's host heap build and walk (workbench.engine.tree_host) against the reference
(workbench.ddtree.tree / walk): node for node, ties included, scores too."""

import numpy as np
import pytest

from tests.kernels.test_tree import _logits
from workbench.ddtree.tree import build_tree, top_k_log_probs
from workbench.ddtree.walk import walk
from workbench.engine.tree_host import build_tree_host, walk_host


def _host_tree(lp, ids, budget, n_pos):
    out = np.full((3, budget + 1), -7, np.int32)
    scores = np.full(budget + 1, np.nan)
    n = build_tree_host(lp, ids, budget, n_pos, out, scores)
    return n, out, scores


@pytest.mark.parametrize("budget", [1, 2, 4, 16, 64, 200])
@pytest.mark.parametrize("kind", ["random", "ties", "oracle"])
def test_build_tree_host_equals_reference_heap(kind, budget):
    n_pos, vocab = 7, 50
    logits = _logits(kind, n_pos, vocab, budget)
    want = build_tree(logits, budget)
    lp, ids = top_k_log_probs(logits, min(budget, vocab))
    n, out, scores = _host_tree(lp, ids.astype(np.int32), budget, n_pos)
    assert n == want.n_nodes
    np.testing.assert_array_equal(out[0, 1:n + 1], want.tokens)
    np.testing.assert_array_equal(out[1, 1:n + 1], want.depths)
    np.testing.assert_array_equal(out[2, :n + 1], want.parents)
    assert scores[0] == 0
    np.testing.assert_allclose(scores[1:n + 1], want.scores, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_walk_host_equals_reference_walk(seed):
    n_pos, vocab, budget = 6, 12, 24
    logits = _logits("random", n_pos, vocab, seed)
    tree = build_tree(logits, budget)
    lp, ids = top_k_log_probs(logits, min(budget, vocab))
    n, out, _ = _host_tree(lp, ids.astype(np.int32), budget, n_pos)
    rng = np.random.default_rng(seed)
    post = rng.integers(0, vocab, n + 1)
    for i in range(1, n + 1):               # make the target agree with the tree along some path
        if rng.random() < 0.7:
            post[out[2, i]] = out[0, i]
    acc = np.zeros(n_pos + 2, np.int32)
    count, bonus = walk_host(out, n, post.astype(np.int32), acc)
    want_acc, want_bonus = walk(tree, post)
    assert list(acc[:count]) == want_acc and bonus == want_bonus


@pytest.mark.parametrize("cut", [1, 3, 9])
def test_walk_host_over_a_prefix_equals_the_reference_prefix_walk(cut):
    """A cost-aware round verifies the first N columns of the built tree: the walk over n = N ignores
    the nodes past N, as the reference's walk over ``tree.prefix(N)``."""
    n_pos, vocab, budget = 5, 6, 20
    logits = _logits("random", n_pos, vocab, cut)
    tree = build_tree(logits, budget)
    lp, ids = top_k_log_probs(logits, min(budget, vocab))
    _, out, _ = _host_tree(lp, ids.astype(np.int32), budget, n_pos)
    post = np.zeros(budget + 1, np.int64)
    for i in range(1, budget + 1):          # the target agrees with every node: the walk goes deepest
        post[out[2, i]] = out[0, i]
    acc = np.zeros(n_pos + 2, np.int32)
    count, bonus = walk_host(out, cut, post[:cut + 1].astype(np.int32), acc)
    want_acc, want_bonus = walk(tree.prefix(cut), post[:cut + 1])
    assert list(acc[:count]) == want_acc and bonus == want_bonus
    assert max(want_acc) <= cut

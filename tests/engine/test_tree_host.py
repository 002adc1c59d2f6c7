"""The engine's host heap build and walk (workbench.engine.tree_host) against the reference
(workbench.ddtree.tree / walk): node for node, ties included, scores too."""

import numpy as np
import pytest

from tests.kernels.test_tree import _logits
from workbench.ddtree.budget import CostCurve, TreeBudget
from workbench.ddtree.tree import build_tree, top_k_log_probs
from workbench.ddtree.walk import walk
from workbench.engine.tree_host import build_tree_host, walk_host


def _host_tree(lp, ids, budget, n_pos, tree_budget=None):
    out = np.full((3, budget + 1), -7, np.int32)
    scores = np.full(budget + 1, np.nan)
    n = build_tree_host(lp, ids, budget, n_pos, out, scores, *(tree_budget or TreeBudget(budget)).host_cost)
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


def _random_curve(rng, top: int) -> CostCurve:
    rows = tuple(sorted(rng.choice(np.arange(1, top), 4, replace=False).tolist()) + [top])
    steep = rng.choice([0.0, 1.0, 20.0, 400.0])                          # flat to a one-node choice
    us = tuple((np.cumsum(rng.uniform(0, steep + 1e-3, len(rows))) + rng.uniform(1, 100)).tolist())
    return CostCurve(rows=rows, verify_us=us, round_us=float(rng.uniform(0, 300)))


@pytest.mark.parametrize("seed", range(24))
def test_cost_aware_heap_stops_early_yet_picks_the_reference_choice(seed):
    """A cost-aware heap returns ``TreeBudget.choose`` over the reference's whole tree, and its first N
    nodes are the reference tree's first N, although it may stop popping before the budget."""
    rng = np.random.default_rng(seed)
    n_pos, vocab = 7, int(rng.choice([3, 40]))                           # 3: the heap can run out
    budget = int(rng.choice([5, 12, 64]))
    logits = _logits(("random", "ties", "oracle")[seed % 3], n_pos, vocab, seed)
    tb = TreeBudget(budget, _random_curve(rng, budget + 1))
    want = build_tree(logits, budget)
    lp, ids = top_k_log_probs(logits, min(budget, vocab))
    n, out, scores = _host_tree(lp, ids.astype(np.int32), budget, n_pos, tb)
    assert n == tb.choose(want.scores)
    cut = tb.cut(want)
    np.testing.assert_array_equal(out[0, 1:n + 1], cut.tokens)
    np.testing.assert_array_equal(out[2, :n + 1], cut.parents)
    np.testing.assert_allclose(scores[1:n + 1], cut.scores, rtol=0, atol=1e-12)


def test_cost_aware_heap_stops_before_the_budget_when_larger_trees_cannot_win():
    """A confident chain of 7 and a curve steep past 8 rows: the heap stops at the candidate 8 (the
    columns past it keep the caller's fill) where the fixed budget pops all 64."""
    logits = np.full((7, 50), -10.0)
    logits[:, 0] = 10.0                                                  # p ~ 1 on a chain of 7
    curve = CostCurve(rows=(1, 9, 65), verify_us=(100.0, 110.0, 5000.0), round_us=50.0)
    lp, ids = top_k_log_probs(logits, 50)
    n, out, _ = _host_tree(lp, ids.astype(np.int32), 64, 7, TreeBudget(64, curve))
    assert n == 8 and TreeBudget(64, curve).choose(build_tree(logits, 64).scores) == n   # chain + 1
    assert (out[0, n + 1:] == -7).all()                                 # never popped


@pytest.mark.parametrize("seed", range(6))
def test_stopping_bound_is_the_largest_rate_over_every_larger_tree(seed):
    """The heap's stopping bound reads the cost curve at its rows only (the rate is monotone between
    them); it equals the maximum over every tree size s in (n, B], each read on the curve."""
    from workbench.engine.tree_host import _bound, _rate
    rng = np.random.default_rng(seed)
    rows = np.cumsum(rng.integers(1, 9, 7)).astype(np.float64) + 1.0
    verify_us = rng.uniform(10, 500, 7)                      # any curve: only its linear pieces matter
    round_us, budget = float(rng.uniform(0, 400)), int(rows[-1] - 1)
    for n in range(1, budget):
        cum, p_n = float(rng.uniform(0, n)), float(rng.uniform(0, 1))
        sizes = range(n + 1, budget + 1)
        brute = max(_rate(cum + (s - n) * p_n, s, rows, verify_us, round_us) for s in sizes)
        assert _bound(cum, p_n, n, budget, rows, verify_us, round_us) == pytest.approx(brute, rel=1e-12)

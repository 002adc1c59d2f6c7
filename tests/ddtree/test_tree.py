"""build_tree / compile_tree / walk on hand-made logits and hand-drawn trees."""

import itertools

import numpy as np
import pytest

from workbench.ddtree.tree import build_tree, compile_tree, top_k_log_probs, visibility_from_parents
from workbench.ddtree.walk import walk
from workbench.errors import InputError

# three positions over V = 4; each row lists token -> probability (ranks differ from ids on purpose)
PROBS = np.array([[0.30, 0.05, 0.50, 0.15],     # depth 1: ranks 2, 0, 3, 1
                  [0.05, 0.70, 0.20, 0.05],     # depth 2: ranks 1, 2, (0|3 tie -> 0 first)
                  [0.03, 0.02, 0.05, 0.90]])    # depth 3: ranks 3, 2, 0, 1


def test_top_k_sorted_with_low_id_tie_break():
    lp, ids = top_k_log_probs(np.log(PROBS), 4)
    assert ids.tolist() == [[2, 0, 3, 1], [1, 2, 0, 3], [3, 2, 0, 1]]
    np.testing.assert_allclose(np.exp(lp), np.take_along_axis(PROBS, ids, axis=1), rtol=1e-12)


def test_hand_made_tree_budget_5():
    # candidate scores by hand: 2:.5, 2-1:.35, 2-1-3:.315, 0:.30, 0-1:.21 (next would be 3:.15, 2-2:.10)
    tree = build_tree(np.log(PROBS) + 7.0, 5)            # a per-row constant must not matter
    assert tree.tokens.tolist() == [2, 1, 3, 0, 1]
    assert tree.depths.tolist() == [1, 2, 3, 1, 2]
    assert tree.parents.tolist() == [-1, 0, 1, 2, 0, 4]
    np.testing.assert_allclose(np.exp(tree.scores), [0.5, 0.35, 0.315, 0.3, 0.21], rtol=1e-12)
    assert tree.child_maps == ({2: 1, 0: 4}, {1: 2}, {3: 3}, {}, {1: 5}, {})
    assert tree.depth == 3 and tree.n_nodes == 5


def test_budget_zero_and_one():
    t0 = build_tree(np.log(PROBS), 0)
    assert t0.n_nodes == 0 and t0.parents.tolist() == [-1] and t0.child_maps == ({},) and t0.depth == 0
    t1 = build_tree(np.log(PROBS), 1)
    assert t1.tokens.tolist() == [2] and t1.depths.tolist() == [1] and t1.parents.tolist() == [-1, 0]


def test_budget_two_uses_top_two_only():
    # K = min(B, V) = 2: node 2 is the depth-2 child 2-1 (.35), beating sibling 0 (.30)
    tree = build_tree(np.log(PROBS), 2)
    assert tree.tokens.tolist() == [2, 1] and tree.parents.tolist() == [-1, 0, 1]


def test_exhausts_all_prefixes_with_ties_in_rank_order():
    # V = 3, L = 2, uniform: 3 + 9 = 12 prefixes, K = min(20, 3) = 3; exact ties pop in rank-path order
    tree = build_tree(np.zeros((2, 3)), 20)
    assert tree.n_nodes == 12
    assert tree.depths.tolist() == [1, 1, 1] + [2] * 9
    assert tree.tokens.tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]
    assert tree.parents.tolist() == [-1, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]


@pytest.mark.parametrize("seed", range(6))
def test_tree_is_top_budget_prefixes(seed):
    # brute force: the tree's node scores are exactly the B best of all prefixes over the top-K tokens
    rng = np.random.default_rng(seed)
    n_pos, vocab = 3, 5
    logits = rng.standard_normal((n_pos, vocab)) * 2
    budget = int(rng.integers(1, 40))
    lp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    k = min(budget, vocab)
    top = np.argsort(-logits, axis=1)[:, :k]
    all_scores = [sum(lp[i, t] for i, t in enumerate(path))
                  for d in range(1, n_pos + 1) for path in itertools.product(*[top[i] for i in range(d)])]
    tree = build_tree(logits, budget)
    np.testing.assert_allclose(np.sort(tree.scores)[::-1], np.sort(all_scores)[::-1][:budget], rtol=1e-12)
    assert np.all(np.diff(tree.scores) <= 1e-12)
    assert np.all(tree.parents[1:] < np.arange(1, tree.n_nodes + 1))
    for i in range(1, tree.n_nodes + 1):      # depth = parent depth + 1 and the score adds one log-prob
        par = tree.parents[i]
        pd = 0 if par == 0 else tree.depths[par - 1]
        assert tree.depths[i - 1] == pd + 1
        ps = 0.0 if par == 0 else tree.scores[par - 1]
        assert tree.scores[i - 1] == pytest.approx(ps + lp[pd, tree.tokens[i - 1]], abs=1e-12)


def test_compile_hand_drawn_tree():
    #        0 (root, token 9)
    #       / \
    #      1   2          depth 1: tokens 4, 6
    #     / \
    #    3   4            depth 2: tokens 5, 7
    #    |
    #    5                depth 3: token 8
    tree = build_tree(np.zeros((1, 2)), 0)    # template; replace its arrays with the drawing
    tree = type(tree)(tokens=np.array([4, 6, 5, 7, 8]), depths=np.array([1, 1, 2, 2, 3]),
                      parents=np.array([-1, 0, 0, 1, 1, 3]), scores=np.zeros(5),
                      child_maps=({4: 1, 6: 2}, {5: 3, 7: 4}, {}, {8: 5}, {}, {}))
    ids, pos, vis = compile_tree(tree, 9, 100)
    assert ids.tolist() == [9, 4, 6, 5, 7, 8]
    assert pos.tolist() == [100, 101, 101, 102, 102, 103]
    expected = np.array([[1, 0, 0, 0, 0, 0],
                         [1, 1, 0, 0, 0, 0],
                         [1, 0, 1, 0, 0, 0],
                         [1, 1, 0, 1, 0, 0],
                         [1, 1, 0, 0, 1, 0],
                         [1, 1, 0, 1, 0, 1]], dtype=bool)
    np.testing.assert_array_equal(vis, expected)
    # walk: root's target token 4 -> node 1; its token 5 -> node 3; its token 8 -> node 5; then bonus 3
    assert walk(tree, np.array([4, 5, 0, 8, 0, 3])) == ([0, 1, 3, 5], 3)
    assert walk(tree, np.array([6, 0, 2, 0, 0, 0])) == ([0, 2], 2)       # leaf: bonus is its token
    assert walk(tree, np.array([4, 1, 0, 0, 0, 0])) == ([0, 1], 1)       # miss at depth 2
    assert walk(tree, np.array([5, 5, 5, 5, 5, 5])) == ([0], 5)          # miss at the root


def test_compile_chain_and_root_only():
    chain = build_tree(np.log(PROBS), 3)        # 2 -> 1 -> 3, a chain
    ids, pos, vis = compile_tree(chain, 0, 7)
    assert ids.tolist() == [0, 2, 1, 3] and pos.tolist() == [7, 8, 9, 10]
    np.testing.assert_array_equal(vis, np.tril(np.ones((4, 4), dtype=bool)))
    root = build_tree(np.log(PROBS), 0)
    ids, pos, vis = compile_tree(root, 5, 3)
    assert ids.tolist() == [5] and pos.tolist() == [3] and vis.tolist() == [[True]]
    assert walk(root, np.array([11])) == ([0], 11)


def test_bad_inputs():
    with pytest.raises(InputError):
        build_tree(np.zeros(4), 3)
    with pytest.raises(InputError):
        build_tree(np.zeros((2, 4)), -1)
    with pytest.raises(InputError):
        visibility_from_parents(np.array([-1, 1]))
    with pytest.raises(InputError):
        walk(build_tree(np.zeros((2, 4)), 2), np.zeros(2, dtype=np.int64))

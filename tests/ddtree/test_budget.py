"""The cost-aware budget (workbench.ddtree.budget): prefixes of the pop order are the smaller-budget
trees, E(N) = 1 + sum of the first N path probabilities (exact enumeration and Monte Carlo), the choice
under flat, steep and random cost curves, the curve file, and greedy DDTree == greedy AR with it."""

import itertools
import json

import numpy as np
import pytest

from tests.ddtree.common import N_TOKENS, PROMPT, greedy, model
from tests.ddtree.test_speculative import RunnerUpDrafter
from workbench.ddtree import CostCurve, TreeBudget, ddtree_generate, expected_tokens, load_cost_curve
from workbench.ddtree.budget import tree_budget
from workbench.ddtree.tree import build_tree
from workbench.ddtree.walk import walk
from workbench.errors import InputError


def _logits(kind: str, n_pos: int, vocab: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "ties":                      # few distinct values: exact ties in the heap
        return rng.integers(0, 3, (n_pos, vocab)).astype(np.float64)
    return 2.0 * rng.standard_normal((n_pos, vocab))


def _accepted_len(tree, y: np.ndarray) -> int:
    """Tokens a round commits (accepted nodes incl. the root) when the target continues with y [L]:
    the target's token at a node of depth d is y[d] (nothing past depth L)."""
    post = [int(y[d]) if d < len(y) else -1 for d in np.concatenate([[0], tree.depths])]
    return len(walk(tree, np.asarray(post))[0])


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("kind", ["random", "ties"])
@pytest.mark.parametrize("seed", range(3))
def test_prefix_of_the_pop_order_is_the_smaller_budget_tree(kind, seed):
    """The first N pops of the B-tree are the N-tree node for node: a valid tree (parents pop before
    children) and, by the heap's construction, the best one of N nodes."""
    logits = _logits(kind, 5, 9, seed)
    big = build_tree(logits, 40)
    for n in range(big.n_nodes + 1):
        cut, want = big.prefix(n), build_tree(logits, n)
        np.testing.assert_array_equal(cut.tokens, want.tokens)
        np.testing.assert_array_equal(cut.depths, want.depths)
        np.testing.assert_array_equal(cut.parents, want.parents)
        np.testing.assert_array_equal(cut.scores, want.scores)
        assert cut.child_maps == want.child_maps
        assert all(0 <= cut.parents[i] < i for i in range(1, n + 1))
    with pytest.raises(InputError):
        big.prefix(big.n_nodes + 1)


@pytest.mark.parametrize("budget", [1, 3, 7, 20])
def test_expected_tokens_equals_exact_enumeration(budget):
    """E over every continuation y in V^L (probability prod_i q_i(y_i)) of the committed tokens of the
    first N pops equals 1 + their summed path probabilities, for every N."""
    n_pos, vocab = 3, 4
    logits = _logits("random", n_pos, vocab, budget)
    q = _softmax(logits)                                                       # [L, V]
    tree = build_tree(logits, budget)
    want = expected_tokens(tree.scores)
    for n in range(tree.n_nodes + 1):
        cut = tree.prefix(n)
        exact = sum(np.prod(q[np.arange(n_pos), y]) * _accepted_len(cut, np.asarray(y))
                    for y in itertools.product(range(vocab), repeat=n_pos))
        assert exact == pytest.approx(want[n], rel=1e-12)


def test_expected_tokens_matches_monte_carlo():
    n_pos, vocab, budget, draws = 6, 30, 24, 20000
    logits = _logits("random", n_pos, vocab, 11)
    q = _softmax(logits)
    tree = build_tree(logits, budget)
    rng = np.random.default_rng(0)
    ys = np.stack([rng.choice(vocab, size=draws, p=q[i]) for i in range(n_pos)], axis=1)   # [draws, L]
    lens = np.asarray([_accepted_len(tree, y) for y in ys], np.float64)
    assert abs(lens.mean() - expected_tokens(tree.scores)[-1]) < 4 * lens.std() / np.sqrt(draws)
    assert expected_tokens(tree.scores)[-1] > 1.5          # the check is not about the bonus alone


def _curve(slope: float, round_us: float = 100.0, top: int = 65) -> CostCurve:
    return CostCurve(rows=(1, top), verify_us=(100.0, 100.0 + (top - 1) * slope), round_us=round_us)


def test_sizes_are_powers_of_two_then_the_budget():
    assert TreeBudget(64, _curve(1)).sizes == (1, 2, 4, 8, 16, 32, 64)
    assert TreeBudget(12, _curve(1)).sizes == (1, 2, 4, 8, 12)
    assert TreeBudget(1, _curve(1)).sizes == (1,)
    assert TreeBudget(12).sizes == (12,)


@pytest.mark.parametrize("seed", range(4))
def test_flat_curve_keeps_the_whole_tree_and_steep_one_a_single_node(seed):
    tree = build_tree(_logits("random", 7, 50, seed), 64)
    assert TreeBudget(64, _curve(0.0)).choose(tree.scores) == 64
    assert TreeBudget(64, _curve(1e4)).choose(tree.scores) == 1
    assert TreeBudget(64).choose(tree.scores) == 64                              # fixed: the whole tree
    assert TreeBudget(64, _curve(0.0)).choose(tree.scores[:37]) == 37            # a smaller tree: all of it


@pytest.mark.parametrize("seed", range(6))
def test_choice_is_the_best_rate_among_the_candidates(seed):
    rng = np.random.default_rng(seed)
    rows = tuple(sorted(rng.choice(np.arange(1, 80), 5, replace=False).tolist()) + [80])
    us = tuple(np.cumsum(rng.uniform(1, 200, len(rows))).tolist())
    curve = CostCurve(rows=rows, verify_us=us, round_us=float(rng.uniform(0, 300)))
    tree = build_tree(_logits("random", 7, 40, seed), 79)
    budget = TreeBudget(79, curve)
    n = budget.choose(tree.scores)
    cands = [s for s in budget.sizes if s < tree.n_nodes] + [tree.n_nodes]
    p = np.exp(tree.scores)
    rate = {c: (1 + p[:c].sum()) / (curve.round_us + np.interp(c + 1, rows, us)) for c in cands}
    assert n in cands and rate[n] == pytest.approx(max(rate.values()), rel=1e-9)
    assert budget.cut(tree).n_nodes == n


def test_cost_curve_file_and_bad_curves(tmp_path):
    curve = _curve(3.0)
    f = tmp_path / "curve.json"
    f.write_text(json.dumps(curve.to_dict()))
    assert load_cost_curve(f) == curve and tree_budget("auto", str(f)) == TreeBudget(64, curve)
    rs = tmp_path / "pair.json"
    rs.write_text(json.dumps({"cost_curves": {"code": curve.to_dict()}}))
    assert load_cost_curve(f"{rs}:code") == curve
    for spec, match in [(rs, "give"), (f"{rs}:other", "give"), (f"{f}:code", "one cost curve"),
                        (tmp_path / "none.json", "cannot read")]:
        with pytest.raises(InputError, match=match):
            load_cost_curve(spec)
    for bad in [dict(rows=(), verify_us=()), dict(rows=(2, 2), verify_us=(1.0, 2.0)),
                dict(rows=(1, 3), verify_us=(1.0,)), dict(rows=(0, 3), verify_us=(1.0, 2.0)),
                dict(rows=(1, 3), verify_us=(1.0, float("nan"))), dict(rows=(1,), verify_us=(0.0,))]:
        with pytest.raises(InputError):
            CostCurve(**bad)
    with pytest.raises(InputError, match="a cost curve is"):
        CostCurve.from_dict({"rows": [1], "verify_us": [1.0], "extra": 1})


@pytest.mark.parametrize("budget, curve, match", [
    (0, None, "budget"), (2.5, None, "budget"), ("8", None, "budget"), ("auto", None, "needs a cost curve"),
    (8, _curve(1.0), "goes with budget auto"), (TreeBudget(4), _curve(1.0), "inside"),
    ("auto", CostCurve(rows=(1,), verify_us=(5.0,)), "measures no tree")])
def test_tree_budget_rejects(budget, curve, match):
    with pytest.raises(InputError, match=match):
        tree_budget(budget, curve)
    with pytest.raises(InputError, match="exceeds the cost curve"):
        TreeBudget(65, _curve(1.0))


@pytest.mark.parametrize("drafter", ["dflash", "oracle", "runner_up"])
@pytest.mark.parametrize("slope", [2.0, 20.0])
def test_cost_aware_greedy_ddtree_equals_greedy_ar(preset_name, drafter, slope):
    cfg, weights, dcfg = model(preset_name)
    ar = greedy(preset_name, N_TOKENS + dcfg.n_drafted)
    if drafter == "runner_up":
        drafter = RunnerUpDrafter(np.concatenate([PROMPT, ar.tokens]), cfg.vocab_size, dcfg.block_size)
    budget = TreeBudget(64, _curve(slope))
    res = ddtree_generate(cfg, weights, PROMPT, N_TOKENS, drafter, budget, drafter_config=dcfg,
                          oracle_p=0.8, continuation=ar.tokens)
    np.testing.assert_array_equal(res.tokens, ar.tokens[:N_TOKENS])
    assert all(r.tree_size in budget.sizes for r in res.rounds)
    assert all(1 <= r.accepted_len <= r.depth + 1 for r in res.rounds)


def test_cost_aware_rounds_follow_the_curve():
    """tiny + dflash: a steep curve keeps small trees, and different ones from round to round."""
    cfg, weights, dcfg = model("tiny")
    sizes = {s: [r.tree_size for r in ddtree_generate(cfg, weights, PROMPT, N_TOKENS, "dflash",
                                                      TreeBudget(64, _curve(s)), drafter_config=dcfg).rounds]
             for s in (0.0, 20.0)}
    assert set(sizes[0.0]) == {64}
    assert max(sizes[20.0]) <= 8 and len(set(sizes[20.0])) > 1

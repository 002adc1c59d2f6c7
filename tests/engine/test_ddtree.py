"""Engine DDTree == reference DDTree == golden tokens (tokens and per-round tree size / accepted
length / depth, so the trees agree too) on every golden bundle, with both drafters and budgets 1, 4,
16 and 64, from the bundle prompt; with the oracle at p = 1 every round accepts a full path (accepted
length = tree depth + 1) of a full tree (size = budget).

GPU tier: every case, all golden tokens. CI (simulator): 13 of the 32 cases (CASES: each bundle at
budgets 1, 4 and 16 with the drafters alternating, so every bundle meets both drafters and every
drafter every budget; budget 16 puts 17 rows through the INT4 bundles' tiled MoE path) for exactly
SIM_ROUNDS[budget] rounds: two rounds at budgets 1 and 4 (so the second verify compacts the first
one's accepted KV rows), one round at budgets 16 and 64 (a simulated 17-row verify takes 5-15 s, a
65-row one 7-35 s with greenlet installed, 20-65 s without). The other tests (partial acceptance,
sampling, host drafter) start from the first 3 prompt tokens under the simulator and compare with the
reference's greedy continuation of that prompt. The dflash cases run the device drafter."""

import numpy as np
import pytest

from kernels_numba import ops
from tests.engine.common import (
    ATOL,
    BUNDLES,
    E2E,
    EXPERTS_TOKENS,
    GPU,
    blas_engine,
    bundle,
    engine,
    experts_engine,
    experts_model,
    reference_greedy,
    sure_steps,
    w16a16_engine,
    w16a16_model,
)
from workbench.ddtree.speculative import ddtree_generate
from workbench.engine.ddtree import engine_ddtree_generate

BUDGETS = (1, 4, 16, 64)
# under the simulator a 65-row verify costs 25-80 s: budget 64 runs once, for the FP32 kernels with the
# host-built tree (tiny, oracle: tiny2's costs twice as much). The fused W4A16 kernels take their tiled
# path at 17 rows as at 65 (budget 16 runs it), and the draft's top-k at K = 64 is test_tree's; the GPU
# tier runs every case
SIM_64 = {("tiny", "oracle")}
DRAFTERS = ("oracle", "dflash")


def _simulated(i: int, d: str, bud: int) -> bool:
    """Bundle i's simulated cases: budgets 1 / 4 / 16 with the drafters in turn, odd bundles starting with
    the other drafter (a pairwise cover of bundle x drafter x budget at a third of the runs)."""
    if bud == 64:
        return (BUNDLES[i], d) in SIM_64
    return DRAFTERS[(i + BUDGETS.index(bud)) % 2] == d


CASES = [(n, d, bud) for i, n in enumerate(BUNDLES) for d in DRAFTERS for bud in BUDGETS
         if GPU or _simulated(i, d, bud)]
SIM_PROMPT = 3
SIM_ROUNDS = {1: 2, 4: 2, 16: 1, 64: 1}


def _prompt_and_expected(name: str, n: int):
    """(prompt, expected tokens): the bundle prompt and golden on the GPU tier; a short prompt and
    the reference's greedy continuation under the simulator."""
    b, _, _ = bundle(name)
    if GPU:
        return np.asarray(b.prompt, np.int64), np.asarray(b.golden[:n])
    prompt = np.asarray(b.prompt[:SIM_PROMPT], np.int64)
    return prompt, reference_greedy(name, n, SIM_PROMPT).tokens


def _tokens_for_rounds(name: str, drafter: str, budget: int, rounds: int, kw: dict, model=None) -> int:
    """The n_tokens that make a run from the bundle prompt take exactly ``rounds`` rounds (read off
    the reference's rounds: the first token comes from the prefill, each round adds accepted_len);
    ``model``: (bundle, weights, _) instead of the golden bundle ``name``."""
    b, w, _ = model or bundle(name)
    prompt = np.asarray(b.prompt, np.int64)
    longest = 1 + rounds * kw["drafter_config"].block_size     # a round adds <= block_size
    ref = ddtree_generate(b.config, w, prompt, longest, drafter, budget, **kw)
    return 1 + sum(r.accepted_len for r in ref.rounds[:rounds - 1]) + 1


@E2E
@pytest.mark.parametrize("name,drafter,budget", CASES)
def test_engine_ddtree_matches_reference_and_golden(name, drafter, budget):
    b, w, dcfg = bundle(name)
    l_draft = dcfg.block_size - 1
    n_max = len(b.golden) if GPU else 1 + SIM_ROUNDS[budget] * dcfg.block_size
    cont = reference_greedy(name, n_max + l_draft).tokens               # the oracle's true continuation
    kw = dict(drafter_config=dcfg, oracle_p=1.0, oracle_seed=0, continuation=cont)
    n = n_max if GPU else _tokens_for_rounds(name, drafter, budget, SIM_ROUNDS[budget], kw)
    prompt, expected = np.asarray(b.prompt, np.int64), np.asarray(b.golden[:n])
    if len(expected) < n:
        raise AssertionError(f"{name}: {n} tokens asked, the bundle holds {len(b.golden)} golden tokens")
    got = engine_ddtree_generate(engine(name), w, prompt, n, drafter, budget, **kw)
    want = ddtree_generate(b.config, w, prompt, n, drafter, budget, **kw)
    np.testing.assert_array_equal(got.tokens, expected)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert [(r.tree_size, r.accepted_len, r.depth) for r in got.rounds] == \
        [(r.tree_size, r.accepted_len, r.depth) for r in want.rounds]
    if not GPU:
        assert len(got.rounds) == SIM_ROUNDS[budget], got.rounds
    if drafter == "oracle":
        assert all(r.accepted_len == r.depth + 1 for r in got.rounds), got.rounds
        assert all(r.tree_size == budget for r in got.rounds)


@E2E
@pytest.mark.parametrize("name,drafter,budget", [("tiny", "dflash", 16), ("int4_tiny", "oracle", 4)])
def test_engine_ddtree_on_blas_matches_reference_and_golden(name, drafter, budget):
    """The verify forward with its FP32 ops on the BLAS path (the attention's ancestor mask included)."""
    b, w, dcfg = bundle(name)
    n_max = len(b.golden) if GPU else 1 + SIM_ROUNDS[budget] * dcfg.block_size
    cont = reference_greedy(name, n_max + dcfg.block_size - 1).tokens
    kw = dict(drafter_config=dcfg, oracle_p=1.0, oracle_seed=0, continuation=cont)
    n = n_max if GPU else _tokens_for_rounds(name, drafter, budget, SIM_ROUNDS[budget], kw)
    prompt = np.asarray(b.prompt, np.int64)
    got = engine_ddtree_generate(blas_engine(name), w, prompt, n, drafter, budget, **kw)
    want = ddtree_generate(b.config, w, prompt, n, drafter, budget, **kw)
    np.testing.assert_array_equal(got.tokens, np.asarray(b.golden[:n]))
    assert [(r.tree_size, r.accepted_len) for r in got.rounds] == \
        [(r.tree_size, r.accepted_len) for r in want.rounds]


@E2E
@pytest.mark.parametrize("name,drafter", [("tiny", "oracle"), ("tiny2", "dflash")] +
                         ([("tiny", "dflash")] if GPU else []))
def test_engine_ddtree_policy_experts_matches_reference(name, drafter):
    """Policy 'experts' (tiny: fused_moe experts, tiny2: portable): engine DDTree == reference DDTree ==
    the reference's greedy tokens, over steps whose greedy margins exceed twice the W4A16 tolerance
    (tests.engine.common.EXPERTS_TOKENS); two rounds under the simulator."""
    from workbench.reference.generate import greedy_generate
    b, w, dcfg = experts_model(name)
    n, budget = EXPERTS_TOKENS[name], 16 if GPU else 4
    greedy = greedy_generate(b.config, w, b.prompt, n + dcfg.block_size)
    assert greedy.margins[:n].min() > 2 * ATOL["int4_tiny"], greedy.margins
    kw = dict(drafter_config=dcfg, oracle_p=1.0, oracle_seed=0, continuation=greedy.tokens)
    if not GPU:
        n = min(n, _tokens_for_rounds(name, drafter, budget, 2, kw, experts_model(name)))
    got = engine_ddtree_generate(experts_engine(name), w, b.prompt, n, drafter, budget, **kw)
    want = ddtree_generate(b.config, w, b.prompt, n, drafter, budget, **kw)
    np.testing.assert_array_equal(got.tokens, greedy.tokens[:n])
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert [(r.tree_size, r.accepted_len, r.depth) for r in got.rounds] == \
        [(r.tree_size, r.accepted_len, r.depth) for r in want.rounds]


@E2E
def test_engine_ddtree_oracle_partial_acceptance():
    """p = 0.5: acceptance varies per round and the engine still equals the reference exactly."""
    name = "tiny"
    b, w, dcfg = bundle(name)
    n = len(b.golden) if GPU else 3
    prompt, expected = _prompt_and_expected(name, n)
    cont = reference_greedy(name, n + dcfg.block_size - 1, len(prompt)).tokens
    kw = dict(drafter_config=dcfg, oracle_p=0.5, oracle_seed=3, continuation=cont)
    got = engine_ddtree_generate(engine(name), w, prompt, n, "oracle", 2, **kw)
    want = ddtree_generate(b.config, w, prompt, n, "oracle", 2, **kw)
    np.testing.assert_array_equal(got.tokens, expected)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert [r.accepted_len for r in got.rounds] == [r.accepted_len for r in want.rounds]


@E2E
@pytest.mark.parametrize("drafter,budget,seed", [
    ("dflash", 2, 5), pytest.param("oracle", 4, 0, marks=pytest.mark.slow)])
def test_engine_ddtree_sampled_equals_reference(drafter, budget, seed):
    """T = 1: the engine draws from the same Generator in the same node order as the reference, so
    tokens and rounds agree exactly, and the run differs from the greedy one (the sampler is live)."""
    from workbench.ddtree.config import SamplingParams
    name = "tiny"
    b, w, dcfg = bundle(name)
    n = len(b.golden) if GPU else 3
    prompt, greedy = _prompt_and_expected(name, n)
    cont = reference_greedy(name, n + dcfg.block_size - 1, len(prompt)).tokens
    kw = dict(drafter_config=dcfg, oracle_p=0.7, oracle_seed=1, continuation=cont)
    sp = SamplingParams(temperature=1.0, seed=seed)
    got = engine_ddtree_generate(engine(name), w, prompt, n, drafter, budget, sp, **kw)
    want = ddtree_generate(b.config, w, prompt, n, drafter, budget, sp, **kw)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert [(r.tree_size, r.accepted_len, r.depth) for r in got.rounds] == \
        [(r.tree_size, r.accepted_len, r.depth) for r in want.rounds]
    assert not np.array_equal(got.tokens, greedy)


@E2E
@pytest.mark.parametrize("drafter", ["oracle", "dflash"])
def test_engine_cost_aware_ddtree_equals_reference(drafter):
    """A cost-aware budget (B = 8: verify steps captured at 1, 2, 4 and 8 nodes) whose curve makes the
    rounds keep different prefixes: the engine picks the reference's tree size every round and gives
    its tokens, the greedy ones."""
    from workbench.ddtree.budget import CostCurve, TreeBudget
    name = "tiny"
    b, w, dcfg = bundle(name)
    n = len(b.golden) if GPU else {"oracle": 8, "dflash": 5}[drafter]
    prompt, expected = _prompt_and_expected(name, n)
    cont = reference_greedy(name, n + dcfg.block_size - 1, len(prompt)).tokens
    kw = dict(drafter_config=dcfg, oracle_p=0.7, oracle_seed=2, continuation=cont)
    budget = TreeBudget(8, CostCurve(rows=(1, 9), verify_us=(100.0, 260.0), round_us=100.0))
    got = engine_ddtree_generate(engine(name), w, prompt, n, drafter, budget, **kw)
    want = ddtree_generate(b.config, w, prompt, n, drafter, budget, **kw)
    np.testing.assert_array_equal(got.tokens, expected)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert [(r.tree_size, r.accepted_len, r.depth) for r in got.rounds] == \
        [(r.tree_size, r.accepted_len, r.depth) for r in want.rounds]
    assert len({r.tree_size for r in got.rounds}) > 1, got.rounds


def test_engine_ddtree_rejects_bad_requests():
    from workbench.errors import InputError
    b, w, dcfg = bundle("tiny")
    eng = engine("tiny")
    with pytest.raises(InputError):
        engine_ddtree_generate(eng, w, b.prompt, 2, "oracle", 0)
    with pytest.raises(InputError):
        engine_ddtree_generate(eng, w, b.prompt, 2, "nope", 4)
    with pytest.raises(InputError):                     # sampling must be a SamplingParams
        engine_ddtree_generate(eng, w, b.prompt, 2, "oracle", 4, {"temperature": 1.0})
    no_drafter = {k: v for k, v in w.items() if not k.startswith("drafter.")}
    with pytest.raises(InputError):
        engine_ddtree_generate(eng, no_drafter, b.prompt, 2, "dflash", 4, drafter_config=dcfg)


@pytest.mark.slow
def test_engine_ddtree_host_drafter_fallback_equals_reference():
    """device_drafter=False (the path of INT4-packed drafter projections): the numpy drafter on the
    copied-back tapped features gives the reference's tokens and rounds too."""
    name = "tiny"
    b, w, dcfg = bundle(name)
    n = len(b.golden) if GPU else 2
    prompt, expected = _prompt_and_expected(name, n)
    got = engine_ddtree_generate(engine(name), w, prompt, n, "dflash", 2, drafter_config=dcfg,
                                 device_drafter=False)
    want = ddtree_generate(b.config, w, prompt, n, "dflash", 2, drafter_config=dcfg)
    np.testing.assert_array_equal(got.tokens, expected)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert [(r.tree_size, r.accepted_len, r.depth) for r in got.rounds] == \
        [(r.tree_size, r.accepted_len, r.depth) for r in want.rounds]


@E2E
@pytest.mark.parametrize("kernel,budget", [(False, 4), (True, 16)])
def test_engine_ddtree_w16a16_matches_the_reference(kernel, budget):
    """tiny W16A16 (bf16 projections and attention core; on the BLAS path, or on the W16A16 kernel with
    the attention norm folded into a1 at decode and summed by ``norm_rows`` in a verify of 17 rows):
    trees verified over the bf16 latent cache give the reference's W16A16 greedy tokens and DDTree
    rounds, over the steps whose reference top-2 margin is wide enough that bf16 rounding flips between
    the two cannot change a token (tests/engine/test_ar.py::test_engine_ar_w16a16_matches_reference)."""
    from tests.engine.test_ar import W16A16_ATOL
    from workbench.reference.generate import greedy_generate, top2_margin
    b, w, _ = w16a16_model("tiny")
    dcfg = bundle("tiny")[2]
    prompt = np.asarray(b.prompt, np.int64)
    n_max = len(b.golden) - 4 if GPU else 9
    ref = greedy_generate(b.config, w, prompt, n_max + dcfg.block_size - 1)
    n = sure_steps([top2_margin(lg) for lg in ref.logits], W16A16_ATOL, n_max)
    assert n >= 3, f"the reference's margins leave {n} sure tokens: the check would compare nothing"
    kw = dict(drafter_config=dcfg, oracle_p=0.8, oracle_seed=1, continuation=ref.tokens)
    eng = w16a16_engine("tiny", kernel, budget)
    a1 = eng.model.layers[0].a1
    assert ops.folds_norm(a1, 1) == kernel and not ops.folds_norm(a1, budget + 1)
    got = engine_ddtree_generate(eng, w, prompt, n, "oracle", budget, **kw)
    want = ddtree_generate(b.config, w, prompt, n, "oracle", budget, **kw)
    np.testing.assert_array_equal(got.tokens, ref.tokens[:n])
    # the last round may accept nodes past n, where the margins were not checked
    assert [(r.tree_size, r.accepted_len) for r in got.rounds[:-1]] == \
        [(r.tree_size, r.accepted_len) for r in want.rounds[:-1]]
    assert len(got.rounds) == len(want.rounds) >= 2

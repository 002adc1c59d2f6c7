"""bench depth's pieces that run without a GPU: how many weight sets fit, the DDTree-vs-AR agreement and its
accounting, the trained pair's replayed acceptance, and the projection's extra terms (workbench.k2proj)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import k2proj
from workbench.bench import k2_depth
from workbench.config import preset


def test_sets_fit_a_h200_and_cap_at_the_moe_layers():
    k2 = preset("k2_6")
    per = k2_depth.set_bytes(k2)
    assert 9.7e9 < per < 9.9e9                                   # 384 INT4 experts + bf16 attention, shared
    assert k2_depth.choose_sets(k2, int(139.8 * 2**30), 24 << 30) == 12
    assert k2_depth.choose_sets(k2, 10**15, 0) == 60
    with pytest.raises(Exception, match="do not fit"):
        k2_depth.choose_sets(k2, int(139.8 * 2**30), 24 << 30, want=20)


def _run(tokens, walls, per_round):
    return {"tokens": np.asarray(tokens), "rounds": len(walls), "wall_s": sum(walls), "round_walls": walls,
            "round_tokens": per_round}


def test_agreement_counts_the_rounds_before_a_mismatch():
    ar = np.arange(10)
    margins = np.full(10, 1.0)
    same = k2_depth._agreement(_run(ar, [1.0, 1.0, 1.0, 1.0], [3, 3, 2, 2]), ar, margins)
    assert same["equal"] and same["passed"] and same["tokens"] == 10 and same["rounds"] == 4
    bad = ar.copy()
    bad[7] = 99
    got = k2_depth._agreement(_run(bad, [1.0, 2.0, 3.0, 4.0], [3, 3, 2, 2]), ar, margins)
    assert not got["passed"] and got["first"] == 7
    assert (got["tokens"], got["rounds"], got["wall_s"]) == (6, 2, 3.0)
    margins[7] = 0.01                                            # a near-tie: the paths may pick either
    assert k2_depth._agreement(_run(bad, [1.0] * 4, [3, 3, 2, 2]), ar, margins)["passed"]


def test_pair_tau_reads_the_committed_pair_set():
    tau, name = k2_depth.pair_tau(k2_depth.Path("reports/bench"))
    assert name is not None and name.startswith("pair_")
    assert set(tau) >= {1, 2, 4, 8, 16, 32, 64} and all(1.0 < t < 9.0 for t in tau.values())


def test_projection_adds_each_measured_term_once():
    cfg = preset("k2_6")
    times = {"dense": {1: 100.0, 3: 120.0}, "moe": {1: 10.0, 3: 20.0}, "step": {1: 5.0, 3: 6.0}}
    terms = {"embed": {1: 1.0, 3: 1.0}, "head": {1: 50.0, 3: 60.0}, "tree": {3: 2.0}, "drafter": 300.0,
             "host": {2: 40.0}}
    ar, b2 = k2proj.project(cfg, times, {2: 2.0}, terms=terms)
    assert ar["step_ms"] * 1e3 == pytest.approx(5 + 100 + 60 * 10 + 1 + 50)
    assert b2["step_ms"] * 1e3 == pytest.approx(6 + 120 + 60 * 20 + 1 + 60 + 2 + 300 + 40)
    plain = k2proj.project(cfg, times, {2: 2.0})
    assert plain[1]["step_ms"] * 1e3 == pytest.approx(6 + 120 + 60 * 20)           # no terms: as before


def test_project_depth_on_parts_and_runs():
    parts = {"dense.layer": {1: 300.0, 3: 320.0}, "moe.layer": {1: 280.0, 3: 400.0},
             "moe.routed_experts": {3: 180.0}, "moe.routed_experts.unique": {3: 24.0},
             "embed": {1: 8.0, 3: 8.0}, "head": {1: 700.0, 3: 700.0}, "drafter": {8: 6000.0}}
    runs = [{"source": "ar", "budget": 0, "tau": 1.0, "ms_per_token": 18.0},
            {"source": "oracle p=0.8", "budget": 2, "tau": 2.0, "ms_per_token": 20.0,
             "draft_ms_per_round": 8.0, "build_us_per_round": 50.0, "walk_us_per_round": 100.0,
             "distinct_experts": 12.0}]
    ar, b2 = k2proj.project_depth(preset("k2_6"), parts, runs)
    assert ar["projected_ms_per_token"] == pytest.approx((300 + 60 * 280 + 8 + 700) / 1e3)
    moe = 400.0 - 0.5 * 180.0                                    # routed experts at 12 of the parts' 24
    want = 320 + 60 * moe + 8 + 700 + 6000 + 150 + 2000          # + drafter, host, draft beyond the drafter
    assert b2["projected_round_ms"] == pytest.approx(want / 1e3)
    assert b2["topk_us_per_round"] == pytest.approx(2000.0) and b2["experts_scale"] == pytest.approx(0.5)
    # a set that records the expert reads (tiles on the tiled path) scales by those, not distinct experts
    parts["moe.routed_experts.reads"] = {3: 40.0}
    runs[1]["expert_reads"] = 30.0
    _, b2 = k2proj.project_depth(preset("k2_6"), parts, runs)
    assert b2["experts_scale"] == pytest.approx(0.75)
    assert b2["projected_round_ms"] == pytest.approx((want + 60 * (0.5 - 0.25) * 180.0) / 1e3)


def test_expert_load_reads_distinct_experts_up_to_the_gemv_rows_and_tiles_above():
    from kernels_numba import ops
    few = np.array([[1, 2], [1, 3]])                                       # 2 rows: the per-pair path
    assert k2_depth.expert_load(few) == {"unique_experts": 3.0, "expert_tiles": 3.0, "expert_reads": 3.0}
    n = ops.GEMV_TOKENS + 1                                                  # the tiled path, two experts
    many = np.repeat(np.array([[5, 6]]), n, axis=0)
    tiles = 2.0 * -(-n // 8)                                                 # each expert's n pairs in 8s
    assert k2_depth.expert_load(many) == {"unique_experts": 2.0, "expert_tiles": tiles, "expert_reads": tiles}


def test_side_by_side_of_the_committed_set_fills_every_term():
    """Read back from the CSV (empty cells), a replayed source takes the measured runs' draft and host
    phases at its budget: every projected term is there (the top-k's may be 0: the draft phase beyond
    the drafter's graph, which the chunked top-k keeps within the drafter's own run-to-run spread)."""
    rows, meta = k2proj.depth_side_by_side("reports/bench")
    assert meta["bench"] == "k2_depth" and "random weights" in meta["weights"]
    assert {r["budget"] for r in rows} == {0, 1, 2, 4, 8, 16, 32, 64}
    for r in rows:
        assert np.isfinite(r["projected_ms_per_token"]) and r["projected_ms_per_token"] > 0
        if r["budget"]:
            assert r["topk_us_per_round"] >= 0
            assert r["host_us_per_round"] > 0 and r["drafter_us_per_round"] > 0


def test_cost_curve_of_the_fixed_runs_takes_verify_per_budget_and_the_rest_at_the_largest():
    """verify(B + 1 rows) per fixed run; the rest of a round (drafter, draft, build, walk) at the largest
    B, whatever the order the runs come in."""
    from workbench.bench.k2_depth import depth_cost_curve

    def run(b, verify_ms, draft_ms):
        return {"budget": b, "verify_ms_per_round": verify_ms, "drafter_ms_per_round": 0.5,
                "draft_ms_per_round": draft_ms, "build_us_per_round": 40.0, "walk_us_per_round": 60.0}
    c = depth_cost_curve([run(4, 30.0, 10.0), run(1, 21.0, 8.0), run(2, 24.0, 9.0)])
    assert c.rows == (2, 3, 5) and c.verify_us == (21000.0, 24000.0, 30000.0)
    assert c.round_us == (0.5 + 10.0) * 1e3 + 40.0 + 60.0


def test_root_row_and_decode_row_agree_on_a_small_stand_in():
    """``root_vs_decode`` on the stand-in in miniature (random weights, four MoE layers over two sets):
    the root of a 3-row chain and the one-row step of the same token at the same position see the same
    keys, so every layer's row differs only by float order (here: not at all past 1e-5) and routes alike.
    A root that saw its children (a causal mask the wrong way round) would differ from the first layer."""
    from kernels_numba.sim import sim_speed
    from tests.engine.common import blas_on
    from tests.engine.test_build import CFG, PROMPT
    from workbench.bench.k2_depth import root_vs_decode
    from workbench.engine.build import RandomSource, build_model
    from workbench.engine.runtime import Engine
    with blas_on(), sim_speed():
        model = build_model(CFG, RandomSource(CFG, seed=6), sets=2)
        eng = Engine(CFG, None, max_len=len(PROMPT) + 8, max_rows=len(PROMPT), model=model)
        res = root_vs_decode(eng, PROMPT, 5, rows=3)
    assert len(res["hidden_rel_diff"]) == CFG.num_hidden_layers
    assert max(res["hidden_rel_diff"]) < 1e-5 and res["first_layer"] is None, res


def test_tree_rows_and_decode_steps_agree_on_a_small_stand_in():
    """``tree_vs_decode`` on the miniature stand-in: AR's three steps against a 5-row tree in which each
    path node follows a sibling. A path row sees the context and its ancestors only, so it differs from
    AR's step by float order alone (here: not past 1e-5) and routes alike; a row that saw its sibling
    (or a sibling's cache row written at its slot) would differ from the first layer."""
    from kernels_numba.sim import sim_speed
    from tests.engine.common import blas_on
    from tests.engine.test_build import CFG, PROMPT
    from workbench.bench.k2_depth import tree_vs_decode
    from workbench.engine.build import RandomSource, build_model
    from workbench.engine.runtime import Engine
    with blas_on(), sim_speed():
        model = build_model(CFG, RandomSource(CFG, seed=6), sets=2)
        eng = Engine(CFG, None, max_len=len(PROMPT) + 8, max_rows=len(PROMPT), model=model)
        res = tree_vs_decode(eng, PROMPT, np.array([5, 17, 40]))
    assert [r["slot"] for r in res] == [0, 2, 4]
    for r in res:
        assert len(r["hidden_rel_diff"]) == CFG.num_hidden_layers
        assert max(r["hidden_rel_diff"]) < 1e-5 and r["first_layer"] is None, r


def test_parting_summary_names_the_first_layer_apart_and_the_last_difference():
    r = {"hidden_rel_diff": [0.0, 0.0, 3e-8, 0.4], "first_layer": 3, "score_gap": 1e-5}
    assert k2_depth.parting_summary(r) == {"first_layer_differing": 2, "first_layer_routing_apart": 3,
                                           "score_gap": 1e-5, "last_layer_rel_diff": 0.4}
    same = k2_depth.parting_summary({"hidden_rel_diff": [0.0, 0.0], "first_layer": None})
    assert same["first_layer_differing"] is None and same["score_gap"] is None


def test_round_drafter_takes_the_prompt_before_the_rounds_and_drafts_its_block_alike():
    """``bench depth``'s drafter runs the prompt in ``start`` (untimed, as the target's prefill); the first
    round replays the captured call on the prompt's last context row alone and drafts the block the
    prompt's eager call drafted, then the next round appends its accepted rows as usual."""
    from types import SimpleNamespace

    from kernels_numba.sim import sim_speed
    from tests.engine.common import engine
    from tests.engine.test_dflash import public_model
    from workbench.bench.k2_depth_drafter import RoundDrafter
    from workbench.engine.dflash import DeviceDFlash
    _, w, dcfg = public_model("tiny")
    eng = engine("tiny")
    eng.put(eng.buf.feats, np.random.default_rng(3).standard_normal(eng.buf.feats.shape).astype(np.float32))
    dev = DeviceDFlash(eng, w, dcfg)
    dev.prepare()
    drafter = RoundDrafter(dev)
    state = SimpleNamespace(bonus=9, start=5, new_rows=np.arange(5, dtype=np.int32))
    with sim_speed():
        drafter.start(state)
        eager = eng.fetch(dev.logits)                                         # [L, V] of the prompt's call
        drafter(state)
        first = eng.fetch(dev.logits)
        assert dev.length == 5 and not drafter.first
        np.testing.assert_allclose(first, eager, rtol=0, atol=1e-5)
        state.bonus, state.start, state.new_rows = 4, 7, np.array([0, 2], np.int32)   # two accepted
        drafter(state)
    assert dev.length == 7


def test_verify_routing_reads_every_moe_layer_and_leaves_the_round_as_it_was():
    """``verify_routing`` runs a verify's forward again, eagerly, to read each MoE layer's routing: one
    [N + 1, K] table per MoE layer, the last one the table the captured verify left, and the logits and
    latent rows the same as the verify's (the run rewrites them with the same values)."""
    from kernels_numba.device import head_rows
    from kernels_numba.sim import sim_speed
    from tests.engine.common import blas_on
    from tests.engine.test_build import CFG, PROMPT
    from workbench.bench.k2_depth import layers_load, verify_routing
    from workbench.ddtree.budget import tree_budget
    from workbench.ddtree.config import GREEDY
    from workbench.ddtree.oracle import OracleDrafter
    from workbench.engine.build import RandomSource, build_model
    from workbench.engine.rounds import EngineSpecState
    from workbench.engine.runtime import Engine
    with blas_on(), sim_speed():
        model = build_model(CFG, RandomSource(CFG, seed=6), sets=2)
        eng = Engine(CFG, None, max_len=len(PROMPT) + 16, max_rows=len(PROMPT), model=model)
        seq = np.concatenate([PROMPT, np.arange(40, 56)])
        state = EngineSpecState(eng, OracleDrafter(seq, CFG.vocab_size, 4, 0.6, 1), tree_budget(4), GREEDY,
                                PROMPT, device_drafter=False)
        state.draft()
        n = state.build_tree()
        state.verify(n)
        last = eng.fetch(head_rows(eng.scratch.rids, n + 1))
        logits, cache = eng.fetch(head_rows(eng.buf.logits, n + 1)), eng.fetch(eng.buf.cache)
        routes = verify_routing(eng, state.step_for[n] + 1, n + 1)
        again, cache_again = eng.fetch(head_rows(eng.buf.logits, n + 1)), eng.fetch(eng.buf.cache)
    moe_layers = CFG.num_hidden_layers - CFG.first_k_dense_replace
    assert len(routes) == moe_layers and all(r.shape == (n + 1, CFG.num_experts_per_tok) for r in routes)
    np.testing.assert_array_equal(routes[-1], last)
    np.testing.assert_allclose(again, logits, rtol=0, atol=1e-6)
    np.testing.assert_allclose(cache_again, cache, rtol=0, atol=1e-6)
    load = layers_load(routes)
    assert load["last_layer_experts"] == len(np.unique(last))
    assert load["unique_experts"] == np.mean([len(np.unique(r)) for r in routes])


def test_the_random_drafter_builds_and_runs_a_round_on_a_small_stand_in():
    """``bench depth``'s drafter (``RandomDFlash``: DeviceDFlash on random weights drawn in place, q || k || v
    stacked as DeviceDFlash stacks them) at the simulator's small shape: the prompt's call, then a round,
    finite draft logits."""
    from types import SimpleNamespace

    from kernels_numba.sim import sim_speed
    from tests.engine.common import blas_on
    from tests.engine.test_build import CFG, PROMPT
    from workbench.bench.k2_depth_drafter import random_drafter
    from workbench.engine.build import RandomSource, build_model
    from workbench.engine.runtime import Engine
    with blas_on(), sim_speed():
        model = build_model(CFG, RandomSource(CFG, seed=6), sets=2)
        eng = Engine(CFG, None, max_len=len(PROMPT) + 16, max_rows=len(PROMPT), taps=(1, 3), model=model)
        drafter, how, _ = random_drafter(eng, 3, log=lambda m: None)
        assert drafter is not None, how
        state = SimpleNamespace(bonus=9, start=5, new_rows=np.arange(5, dtype=np.int32))
        drafter.start(state)                                                  # the prompt's call
        drafter(state)                                                        # the first round
        state.bonus, state.start, state.new_rows = 4, 7, np.array([0, 2], np.int32)   # two accepted
        drafter(state)
        logits = eng.fetch(drafter.dev.logits)
    assert logits.shape[0] == 7 and np.isfinite(logits).all()


def test_drafter_round_bytes_are_its_weights_the_head_and_its_cached_rows():
    """The drafter round's floor reads its W16A16 weights (fc, each layer's stacked projections and MLP)
    and the target's lm_head once, 2 bytes a weight, and each layer's cached K and V rows (float32)."""
    from kernels_numba.sim import sim_speed
    from tests.engine.common import blas_on
    from tests.engine.test_build import CFG
    from workbench.bench.k2_depth_drafter import RandomDFlash, drafter_config, round_bytes
    from workbench.engine.build import RandomSource, build_model
    from workbench.engine.runtime import Engine
    taps = (1, 3)
    with blas_on(), sim_speed():
        model = build_model(CFG, RandomSource(CFG, seed=6), sets=2)
        eng = Engine(CFG, None, max_len=32, max_rows=8, taps=taps, model=model)
        dcfg = drafter_config(CFG, taps)
        dev = RandomDFlash(eng, dcfg, RandomSource(CFG, 7))
    d, h, hkv, hd, i = CFG.hidden_size, dcfg.n_heads, dcfg.kv_heads, dcfg.head_dim, dcfg.intermediate_size
    layer = (h + 2 * hkv) * hd * d + 2 * hkv * hd * d + d * h * hd + 3 * i * d
    weights = d * len(taps) * d + CFG.vocab_size * d + dcfg.n_layers * layer
    kv = dcfg.n_layers * 2 * (20 + dcfg.block_size) * hkv * hd * 4
    assert round_bytes(dev, 20) == 2 * weights + kv


def test_run_order_takes_every_p_at_the_small_budgets_before_any_large_one():
    order = k2_depth.run_order((0.8, 0.5), (1, 4, 8, 16, 64))
    assert order == [(0.8, 1), (0.8, 4), (0.8, 8), (0.5, 1), (0.5, 4), (0.5, 8),
                     (0.8, 16), (0.8, 64), (0.5, 16), (0.5, 64)]
    assert k2_depth.run_order((0.9,), (16, 2)) == [(0.9, 2), (0.9, 16)]       # small first, as given or not

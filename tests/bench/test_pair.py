"""``bench pair``: the per-prompt AR / DDTree loop on the engine (the simulator here), its summary, and
one-line errors for bad arguments."""

import argparse

import numpy as np
import pytest

from workbench.bench import common, pair
from workbench.refs import golden_bundle


def test_loop_runs_ar_every_budget_then_the_cost_aware_one_all_equal_to_ar(monkeypatch):
    """AR and every fixed budget per prompt, greedy DDTree == AR; with --cost-aware the curve is read off
    the fixed budgets' runs (verify at B + 1 rows), and the cost-aware rows (mode ddtree_auto, budget =
    the largest B) and the best fixed budget's again beside them (mode ddtree_best) still give AR's
    tokens."""
    monkeypatch.setattr(pair, "WARM_TOKENS", 2)
    b = golden_bundle("tiny")
    prompts = [("a", np.asarray(b.prompt[:5], np.int64))]
    rows: list[dict] = []
    calls = []
    curve = pair.bench_bundle(str(b.path), prompts, 3, (1, 4), rows, cost_aware=True,
                              progress=lambda d, t, what: calls.append((d, t, what)))
    assert [(r["prompt"], r["mode"], r["budget"]) for r in rows[:3]] == [("a", "ar", 0), ("a", "ddtree", 1),
                                                                          ("a", "ddtree", 4)]
    assert all(r["tokens_equal_ar"] for r in rows)                       # greedy DDTree == AR
    ar, _, b4 = pair.summarize(rows[:3])
    assert ar["speedup"] == 1.0 and ar["tau"] == 1.0
    assert b4["tok_s"] == pytest.approx(rows[2]["tokens"] / rows[2]["seconds"]) and b4["tau"] >= 1.0
    assert 1 <= rows[2]["rounds"] <= 4
    assert [(d, t) for d, t, _ in calls] == [(0, 2), (1, 2)]      # the prompt, then its cost-aware run
    assert "cost-aware" in calls[1][2]
    assert curve.rows == (2, 5) and curve.round_us >= 0
    dd = {r["budget"]: r for r in rows if r["mode"] == "ddtree"}
    assert curve.verify_us == pytest.approx((dd[1]["verify_us_per_round"], dd[4]["verify_us_per_round"]))
    auto = [r for r in rows if r["mode"] == "ddtree_auto"]
    assert len(auto) == 1 and auto[0]["budget"] == 4 and auto[0]["tokens_equal_ar"]
    assert 1 <= auto[0]["nodes_per_round"] <= 4
    first_pass = pair.summarize([r for r in rows if r["mode"] in ("ar", "ddtree")])
    again = [r for r in rows if r["mode"] == "ddtree_best"]                # beside it, in the same pass
    assert [r["mode"] for r in rows[-2:]] == ["ddtree_auto", "ddtree_best"]
    assert len(again) == 1 and again[0]["budget"] == pair.best(first_pass)["tiny"]["budget"]
    assert again[0]["tokens_equal_ar"]
    assert sorted(c["mode"] for c in pair.summarize(rows)) == ["ar", "ddtree", "ddtree", "ddtree_auto",
                                                               "ddtree_best"]


def test_cost_curve_from_summary_cells():
    cells = [dict(budget=b, verify_us_per_round=v, tok_s=1000.0, tokens_per_round=2.0)
             for b, v in ((4, 300.0), (1, 200.0))]
    curve = pair.cost_curve(cells)
    assert curve.rows == (2, 5) and curve.verify_us == (200.0, 300.0)
    assert curve.round_us == pytest.approx(2000.0 - 300.0)           # 2 ms per round at B = 4, less verify


def test_summary_weights_prompts_by_time():
    ar = dict(model="m", mode="ar", budget=0, tokens=10, tau=1.0, rounds=10, tokens_equal_ar=True)
    rows = [dict(ar, seconds=1.0), dict(ar, seconds=3.0)]
    rows += [dict(r, mode="ddtree", budget=2, seconds=r["seconds"] / 2, rounds=k, tau=10 / k,
                  draft_us_per_round=1.0, build_us_per_round=2.0, verify_us_per_round=3.0,
                  tokens_equal_ar=k == 2)
             for r, k in zip(rows, (2, 8), strict=True)]
    ar, dd = pair.summarize(rows)
    assert ar["tok_s"] == 5.0 and dd["tok_s"] == 10.0 and dd["speedup"] == 2.0
    assert dd["tau"] == (5.0 + 1.25) / 2 and dd["tokens_per_round"] == 2.0         # per prompt / pooled
    assert dd["verify_us_per_round"] == 3.0 and dd["all_equal_ar"] is False


@pytest.mark.parametrize("argv, msg", [(["--budgets", "1,x"], "comma-separated ints"),
                                       (["--prompts", "0"], "prompts >= 1")])
def test_bad_arguments_are_one_line_errors(monkeypatch, tmp_path, argv, msg):
    from kernels_numba import device
    from workbench.cli import UserError
    from workbench.commands import bench
    from workbench.errors import InputError
    monkeypatch.setattr(common, "require_gpu", lambda: None)
    monkeypatch.setattr(device, "SIMULATED", False)
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    with pytest.raises((UserError, InputError), match=msg):
        bench.run(p.parse_args(["pair", "--out", str(tmp_path), *argv]))


def test_best_takes_each_models_fastest_ddtree_budget():
    cells = [dict(model="m", mode="ar", budget=0, speedup=1.0),
             dict(model="m", mode="ddtree", budget=4, speedup=0.9),
             dict(model="m", mode="ddtree", budget=16, speedup=1.2),
             dict(model="q", mode="ddtree", budget=2, speedup=0.5)]
    got = pair.best(cells)
    assert {m: c["budget"] for m, c in got.items()} == {"m": 16, "q": 2}

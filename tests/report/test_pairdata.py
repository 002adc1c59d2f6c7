"""report.pairdata: the committed training run reads, the newest run folder wins, measure summaries
flatten, and the pair bench rows come back as bench.pair wrote them."""

import json
import os
from pathlib import Path

from workbench.bench.pair import summarize
from workbench.report import pairdata
from workbench.results import result_set

ROOT = Path(__file__).resolve().parents[2]


def test_committed_training_run_reads():
    tr = pairdata.load_training(ROOT / "reports" / "train")
    assert tr is not None and tr["gpu"] == "NVIDIA H200"
    assert tr["target"]["steps"] > 0 and tr["drafter"]["steps"] > 0
    assert tr["target_steps"][0]["step"] == 1 and tr["drafter_evals"]
    assert set(tr["drafter"]["eval"]["chain_accepted_len_by_prompt"]) == {"window", "body"}


def _acceptance(model="m"):
    cells = [{"temperature": 0.0, "tree": "ddtree", "budget": b, "tau": 1.0 + b / 10} for b in (1, 4)]
    cells.append({"temperature": 0.0, "tree": "chain", "budget": 15, "tau": 1.2})
    return {"labels": {}, "models": {model: {"rows": [], "summary": {
        "cells": cells, "best": {"T=0": {"best_budget": 4, "best_tau": 1.4, "chain_tau": 1.2}}}}}}


def test_newest_measure_run_and_its_tables(tmp_path):
    for name, model in (("code_pair_aaa", "old"), ("code_pair_bbb", "new")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "acceptance.json").write_text(json.dumps(_acceptance(model)))
    os.utime(tmp_path / "code_pair_aaa", (1, 1))                       # older
    acc, drift, run = pairdata.load_measure(tmp_path)
    assert run.name == "code_pair_bbb" and drift is None
    assert pairdata.tau_by_budget(acc, "new") == {1: 1.1, 4: 1.4}
    assert pairdata.best(acc) == [{"model": "new", "temperature": "T=0", "best_budget": 4, "best_tau": 1.4,
                                   "chain_tau": 1.2}]
    assert len(pairdata.cells(acc)) == 3
    assert pairdata.load_measure(tmp_path / "none") is None


def test_pair_bench_rows_round_trip(tmp_path):
    rs = result_set(tmp_path, "pair", "abc1234")
    rs.csv.write_text("model,mode,budget,tokens,seconds,tau,rounds,tokens_equal_ar,verify_us_per_round\n"
                      "m,ar,0,10,1.0,1.0,10,True,\nm,ddtree,4,10,0.5,2.5,4,False,7.5\n")
    rs.meta.write_text(json.dumps({"git_sha": "abc1234", "time_utc": "2026-01-01T00:00:00+00:00"}))
    rows, meta, path = pairdata.load_pair_bench(tmp_path)
    assert rows[0]["tokens_equal_ar"] is True and "verify_us_per_round" not in rows[0]
    ar, dd = summarize(rows)
    assert dd["speedup"] == 2.0 and dd["all_equal_ar"] is False and dd["verify_us_per_round"] == 7.5


def test_committed_engine_run_accepts_as_the_reference():
    """The committed `bench pair` set (GPU engine) against the committed `measure` run (numpy
    reference): wherever both produced AR's tokens, the same tau for the same bundle, prompt and
    budget, except for rare float32 near-ties in the drafter's log-probs that reorder a tree (2 of
    the 1,344 runs at 3c1ba56, gaps of 7e-7 and 2e-5 between ranks: docs/perf.md), which move tau a
    little. Runs where either side left AR's tokens (a near-tie of the target) are not compared."""
    rows, _, _ = pairdata.load_pair_bench(ROOT / "reports" / "bench")
    acc, _, _ = pairdata.load_measure(ROOT / "reports" / "measure")
    ref = {(m, r["prompt"], r["budget"]): r for m, v in acc["models"].items() for r in v["rows"]
           if r["temperature"] == 0 and r["tree"] == "ddtree"}
    both = [(r, ref[r["model"], r["prompt"], r["budget"]]) for r in rows if r["mode"] == "ddtree"]
    both = [(e, m) for e, m in both if e["tokens_equal_ar"] and m["equals_ar"]]
    off = [abs(e["tau"] - m["tau"]) for e, m in both if abs(e["tau"] - m["tau"]) > 1e-12]
    assert len(both) >= 1000
    assert len(off) <= 0.005 * len(both) and all(d < 0.1 for d in off), off


def test_departures_from_measure_and_bench_rows():
    measure = [{"model": "m", "prompt": "HumanEval/12", "budget": b, "temperature": 0.0, "equals_ar": b != 2}
               for b in (1, 2, 4)]
    measure += [{"model": "m", "prompt": "HumanEval/12", "budget": 64,
                 "temperature": 1.0, "equals_ar": False},
                {"model": "m", "prompt": "HumanEval/3", "budget": 4, "temperature": 0.0, "equals_ar": None}]
    measure.append({"model": "m", "prompt": "HumanEval/12", "tree": "chain", "budget": 15, "temperature": 0.0,
                    "equals_ar": False})
    assert pairdata.departures(measure) == [{"model": "m", "prompt": "HumanEval/12", "budgets": [2],
                                             "chain": True}]
    bench = [{"model": "models/q.kdtr", "prompt": "HumanEval/12", "budget": b, "tokens_equal_ar": b == 8}
             for b in (4, 8, 64)]
    assert pairdata.departures(bench) == [{"model": "q", "prompt": "HumanEval/12", "budgets": [4, 64],
                                           "chain": False}]


def test_near_tie_measures_ars_margins():
    """On the tiny golden bundle DDTree gives AR's tokens; the margins are the golden's (same reference)."""
    import numpy as np

    from workbench.bundle import read_bundle
    from workbench.ddtree import DrafterConfig
    b = read_bundle(ROOT / "refs" / "tiny.kdtr")
    n = 12
    r = pairdata.near_tie(b.config, b.weights(), DrafterConfig.from_dict(b.meta["drafter"]), b.prompt, n, 4)
    margins = np.asarray(b.margins[:n], np.float64)
    assert r["parted_at"] is None and r["margin_there"] is None and r["min_step"] == int(np.argmin(margins))
    assert abs(r["min_margin"] - margins.min()) < 1e-4
    text = pairdata.near_tie_text({"model": "m", "prompt": "HumanEval/12", "budgets": [4, 64], "chain": True},
                                  {**r, "parted_at": 3, "margin_there": 2.5e-4})
    assert "at B = 4, 64 and the DFlash chain" in text and "step 3" in text
    assert "0.00025" in text and "near-tie" in text

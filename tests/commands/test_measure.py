"""``python -m workbench measure`` on the toy pair: acceptance rows and cells, drift, labels, errors."""

import csv
import json
import re

import pytest

from workbench.cli import main


def test_two_workers_give_the_rows_of_one(toy_run):
    from workbench.train.measure import humaneval_prompts, load_pair, sweep
    path = str(toy_run / "bundles" / "code.kdtr")
    prompts = humaneval_prompts(load_pair(path).tok, 2)
    one = sweep(path, "code", prompts, 6, [2], temperature=1.0, seed=4)
    two = sweep(path, "code", prompts, 6, [2], temperature=1.0, seed=4, workers=2)
    assert one == two
    assert [r["prompt"] for r in two] == ["HumanEval/0", "HumanEval/0", "HumanEval/1", "HumanEval/1"]


def test_measure_writes_acceptance_and_drift(toy_run, tmp_path, capsys):
    b = toy_run / "bundles"
    argv = ["measure", str(b / "code.kdtr"), "--out", str(tmp_path), "--int4", str(b / "code_int4_mlp.kdtr"),
            "--prompts", "2", "--tokens", "10", "--budgets", "1,8", "--drift-prompts", "1",
            "--drift-tokens", "12"]
    assert main(argv) == 0
    acc = json.loads((tmp_path / "acceptance.json").read_text())
    assert set(acc["labels"]) == {"model", "prompts", "new_tokens", "machine", "commit"}
    assert set(acc["models"]) == {"code", "code_int4_mlp"}
    s = acc["models"]["code"]["summary"]
    cases = [("chain", 3), ("ddtree", 1), ("ddtree", 8)]
    assert [(c["temperature"], c["tree"], c["budget"]) for c in s["cells"]] == [(t, *c) for t in (0, 1)
                                                                                for c in cases]
    assert s["all_equal_ar"] and set(s["best"]) == {"T=0", "T=1"}
    assert s["best"]["T=0"]["best_budget"] in (1, 8) and s["best"]["T=1"]["ddtree_over_chain"] > 0
    assert all(0 < c["overlap_ratio"] <= 1.0 + 1e-9 for c in s["cells"])
    assert len(acc["models"]["code"]["rows"]) == 2 * 3 * 2
    with open(tmp_path / "acceptance.csv") as f:
        assert len(list(csv.DictReader(f))) == 2 * 2 * 3
    d = json.loads((tmp_path / "drift.json").read_text())
    assert len(d["runs"]) == 1 and len(d["runs"][0]["kl"]) == 12
    cap = capsys.readouterr()
    taus = re.findall(r"tau (\S+?)[ ;]", cap.out)
    assert len(taus) == 8 and all(re.fullmatch(r"\d+\.\d{3}", t) for t in taus), cap.out  # one rounding
    assert "%|" not in cap.err and "measure:" not in cap.err            # no bar off a terminal


@pytest.mark.parametrize("extra, msg", [(["--budgets", "1,x"], "comma-separated"),
                                        (["--budgets", "0"], ">= 1"), (["--tokens", "0"], "--tokens"),
                                        (["--budgets", "4,2000"], "--budgets"),
                                        (["--temperatures", "0,1e-320,nan"], "--temperatures"),
                                        (["--tokens", "2000", "--prompts", "1"], "max_position_embeddings"),
                                        (["--int4", "X", "--drift-tokens", "5000", "--prompts", "1"],
                                         "--drift-tokens")])
def test_bad_measure_arguments(toy_run, tmp_path, capsys, extra, msg):
    """Refused before any measuring, like generate: options within bounds, positions within the context."""
    extra = [str(toy_run / "bundles" / "code_int4_mlp.kdtr") if a == "X" else a for a in extra]
    out = tmp_path / "out"
    assert main(["measure", str(toy_run / "bundles" / "code.kdtr"), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err, err
    assert not out.exists()

"""``generate --mode chain``: the plain DFlash chain through the CLI, with per-round statistics in
--json like ddtree, tokens equal to greedy AR's."""

import json
from pathlib import Path

from workbench.bundle import read_bundle
from workbench.cli import main

TINY = str(Path(__file__).resolve().parents[2] / "refs" / "tiny.kdtr")


def _run(capsys, *argv):
    rc = main(["generate", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_chain_json_has_rounds_and_equals_ar(capsys):
    b = read_bundle(TINY)
    rc, out, err = _run(capsys, TINY, "--mode", "chain", "--tokens", "12", "--json")
    assert rc == 0 and err.startswith("chain on the numpy reference") and err.count("\n") == 1   # the summary
    res = json.loads(out)
    assert res["tokens"] == [int(t) for t in b.golden[:12]]
    n_pos = b.meta["drafter"]["block_size"] - 1
    assert res["rounds"] and all(r["tree_size"] == r["depth"] == n_pos for r in res["rounds"])
    assert res["mean_accepted"] == sum(r["accepted_len"] for r in res["rounds"]) / len(res["rounds"])
    rc, out, err = _run(capsys, TINY, "--mode", "chain", "--drafter", "oracle", "--tokens", "12")
    assert rc == 0 and out.split() == [str(int(t)) for t in b.golden[:12]] and "accepted lengths" in err


def test_unknown_mode_exits_2(capsys):
    rc, out, err = _run(capsys, TINY, "--mode", "tree")
    assert rc == 2 and out == ""

"""The expert union of oracle DDTree trees on a checkpoint's first layers: the verify forward's routing of
the accepted (true) path equals a plain forward's routing of the true text, the rounds cover the text,
and ``measure --checkpoint`` writes its cells (HumanEval canonical solutions, a synthetic K2.6 checkpoint
with a Kimi tokenizer)."""

import json

import numpy as np
import pytest

from tests.checkpoint.common import CFG8, tiktoken_files
from workbench.checkpoint import open_checkpoint
from workbench.checkpoint.synthetic import write_k26_checkpoint
from workbench.cli import main
from workbench.reference.model import LatentCache, forward
from workbench.train.measure import oracle_union, verify_routes


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    d = write_k26_checkpoint(tmp_path_factory.mktemp("ck") / "k26", CFG8, seed=7)
    tiktoken_files(d)
    return d


def test_verify_routes_are_the_forward_routes(ck):
    t = open_checkpoint(ck, "0..3")
    toks = np.random.default_rng(0).integers(0, CFG8.vocab_size, 9)
    want = forward(t.cfg, t, toks, LatentCache.empty(t.cfg, 9)).routes
    got = verify_routes(t.cfg, t, toks, LatentCache.empty(t.cfg, 9))
    assert len(got) == 2 and all(np.array_equal(g, want[i + 1]) for i, g in enumerate(got))


@pytest.mark.parametrize("budget, p", [(1, 1.0), (12, 0.7), (40, 0.9)])
def test_the_accepted_path_routes_as_the_true_text_does(ck, budget, p):
    t = open_checkpoint(ck, "0..3")
    rng = np.random.default_rng(budget)
    prompt, truth = rng.integers(0, CFG8.vocab_size, 5), rng.integers(0, CFG8.vocab_size, 30)
    trace = []
    run = oracle_union(t.cfg, t, prompt, truth, budget, p, seed=1, trace=trace)
    assert sum(run.accepted) in (len(truth) - 1, len(truth))
    assert max(run.verify_tokens) <= budget + 1 and max(run.accepted) > (1 if budget > 1 else 0)
    seq = np.concatenate([prompt, truth])
    full = forward(t.cfg, t, seq, LatentCache.empty(t.cfg, seq.size)).routes      # {layer: [P+T, k]}
    for positions, accepted, routes in trace:
        for j, layer in enumerate(sorted(full)):
            np.testing.assert_array_equal(routes[j][accepted], full[layer][positions[accepted]])
    assert all(len(e) == 2 and min(e) >= t.cfg.num_experts_per_tok for e in run.experts)


def test_measure_checkpoint_writes_the_expert_union_cells(ck, tmp_path, capsys):
    rc = main(["measure", "--checkpoint", str(ck), "--layers", "0..3", "--out", str(tmp_path / "m"),
               "--prompts", "2", "--tokens", "12", "--budgets", "1,8"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    res = json.loads((tmp_path / "m" / "expert_union.json").read_text())
    cells = res["summary"]["cells"]
    assert [c["budget"] for c in cells] == [1, 8] and res["labels"]["checkpoint_layers"] == [0, 1, 2]
    assert cells[0]["verify_tokens"] <= 2 < cells[1]["verify_tokens"] <= 9
    assert cells[0]["experts"] < cells[1]["experts"] <= CFG8.n_routed_experts
    assert "B=8:" in out and (tmp_path / "m" / "expert_union.csv").exists()


@pytest.mark.parametrize("argv, match", [
    ([], "needs --layers"),
    (["--layers", "0..2", "--oracle-p", "2"], "--oracle-p: must be <= 1"),
])
def test_bad_measure_checkpoint_arguments_exit_2(ck, tmp_path, capsys, argv, match):
    rc = main(["measure", "--checkpoint", str(ck), "--out", str(tmp_path / "m"), *argv])
    assert rc == 2 and match in capsys.readouterr().err


def test_a_checkpoint_without_tokenizer_is_refused(tmp_path, capsys):
    d = write_k26_checkpoint(tmp_path / "k", CFG8.replace(num_hidden_layers=2), seed=1)
    rc = main(["measure", "--checkpoint", str(d), "--layers", "0..2", "--out", str(tmp_path / "m")])
    assert rc == 2 and "has no tiktoken.model" in capsys.readouterr().err
    rc = main(["measure", "--out", str(tmp_path / "m")])
    assert rc == 2

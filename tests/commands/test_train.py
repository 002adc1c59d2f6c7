"""``python -m workbench train all --size toy`` on CPU: the losses fall, a rerun resumes instead of
retraining, the three bundles validate and carry tokenizer + provenance, and ``generate --text``
decodes with them. Bad arguments are one-line exit-2 errors."""

import json

import numpy as np
import pytest

from workbench.bundle import read_bundle
from workbench.cli import main
from workbench.config import ModelConfig
from workbench.train.tokenizer import tokenizer_from_meta


def _log(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_target_and_drafter_losses_fall(toy_run):
    for part in ("target", "drafter"):
        steps = [r for r in _log(toy_run / part / "log.jsonl") if r["event"] == "step"]
        assert len(steps) >= 4
        first, last = steps[0]["loss"], np.mean([r["loss"] for r in steps[-2:]])
        assert steps[0]["step"] == 1 and last < first - 0.5, (part, first, last)
    rep = json.loads((toy_run / "target" / "report.json").read_text())
    assert rep["steps"] == 40 and np.isfinite(rep["eval"]["heldout_loss"])
    assert len(rep["eval"]["expert_counts"]) == 1 and len(rep["eval"]["expert_counts"][0]) == 8
    drafter = json.loads((toy_run / "drafter" / "report.json").read_text())
    assert set(drafter["eval"]["chain_accepted_len_by_prompt"]) == {"window", "body"}    # both prompt kinds


def test_rerun_resumes_the_finished_runs(toy_run, capsys):
    before = {p: (toy_run / p / "ckpt.pt").stat().st_mtime_ns for p in ("target", "drafter")}
    argv = ["train", "target", "--size", "toy", "--out", str(toy_run), "--device", "cpu", "--no-progress"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[0])
    assert out["target"]["steps"] == 40
    events = [r["event"] for r in _log(toy_run / "target" / "log.jsonl")]
    assert events[-2:] == ["resume", "done"] and events.count("step") == 9
    assert (toy_run / "drafter" / "ckpt.pt").stat().st_mtime_ns == before["drafter"]


def test_bundles_validate_and_carry_tokenizer_and_provenance(toy_run):
    summary = json.loads((toy_run / "summary.json").read_text())
    names = ("code", "code_int4_experts", "code_int4_mlp")
    for name in names:
        b = read_bundle(toy_run / "bundles" / f"{name}.kdtr")
        assert isinstance(b.config, ModelConfig) and b.config.n_routed_experts == 8
        assert tokenizer_from_meta(b.meta).vocab_size == b.config.vocab_size
        assert b.provenance["commit"] == "abc123" and b.provenance["target_steps"] == 40
        assert len(b.provenance["corpus_manifest_sha256"]) == 64
        assert len(b.golden) == 32 and b.meta["golden_task"] == "HumanEval/2"
        assert summary["bundles"][name]["bytes"] == (toy_run / "bundles" / f"{name}.kdtr").stat().st_size
    q = {n: read_bundle(toy_run / "bundles" / f"{n}.kdtr").meta["quant"] for n in names[1:]}
    assert q["code_int4_experts"]["policy"] == "experts" and q["code_int4_mlp"]["policy"] == "mlp"
    assert q["code_int4_experts"]["n_quantized"] == 8 * 3 < q["code_int4_mlp"]["n_quantized"]


def test_generate_text_decodes_with_the_bundle_tokenizer(toy_run, capsys):
    bundle = str(toy_run / "bundles" / "code.kdtr")
    assert main(["generate", bundle, "--text", "def f(x):", "--tokens", "5", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    tok = tokenizer_from_meta(read_bundle(bundle).meta)
    assert len(res["tokens"]) == 5 and res["text"] == tok.decode(res["tokens"])
    assert main(["generate", bundle, "--text", "def f(x):", "--tokens", "4", "--mode", "ddtree"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == tok.decode(res["tokens"][:4])


@pytest.mark.parametrize("argv, msg", [
    (["train", "target", "--size", "toy"], "needs --out"),
    (["train", "target", "--size", "toy", "--out", "x", "--target-steps", "0"], "must be >= 1"),
    (["train", "bogus"], "invalid choice"),
])
def test_bad_arguments_are_one_line_errors(argv, msg, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err


def test_text_prompt_needs_a_bundle_tokenizer(capsys):
    from pathlib import Path
    tiny = str(Path(__file__).resolve().parents[2] / "refs" / "tiny.kdtr")
    assert main(["generate", tiny, "--text", "x = 1"]) == 2
    assert "carries no tokenizer" in capsys.readouterr().err
    assert main(["generate", tiny, "--text", "x", "--prompt", "1,2"]) == 2
    assert "either --prompt or --text" in capsys.readouterr().err

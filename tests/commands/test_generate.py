"""``python -m workbench generate``: reference AR == golden, DDTree on both backends, and one-line
exit-2 errors for bad input (unknown drafter, budget < 1, budget auto without a cost curve, token >=
vocab, bad prompt syntax, dflash without drafter weights); --budget auto with a cost curve."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.bundle import read_bundle, write_bundle
from workbench.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "refs" / "tiny.kdtr")


def _run(capsys, *argv):
    rc = main(["generate", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_reference_ar_reproduces_the_golden(capsys):
    rc, out, _ = _run(capsys, TINY, "--json")
    assert rc == 0
    assert json.loads(out) == [int(t) for t in read_bundle(TINY).golden]


def test_reference_ar_plain_output_and_prompt(capsys):
    rc, out, _ = _run(capsys, TINY, "--prompt", "1, 2,3", "--tokens", "3")
    assert rc == 0 and len(out.split()) == 3


def test_reference_ddtree_json_has_rounds(capsys):
    b = read_bundle(TINY)
    rc, out, _ = _run(capsys, TINY, "--mode", "ddtree", "--drafter", "oracle", "--budget", "4",
                      "--tokens", "12",
                      "--json")
    res = json.loads(out)
    assert rc == 0 and res["tokens"] == [int(t) for t in b.golden[:12]]
    assert all(r["accepted_len"] == r["depth"] + 1 and r["tree_size"] == 4 for r in res["rounds"])


def test_reference_ddtree_budget_auto_follows_the_cost_curve(capsys, tmp_path):
    """--budget auto: B = the curve's largest measured tree (8); each round keeps 1, 2, 4 or 8 nodes;
    the tokens stay the golden ones."""
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps({"rows": [1, 9], "verify_us": [100.0, 260.0], "round_us": 100.0}))
    rc, out, _ = _run(capsys, TINY, "--mode", "ddtree", "--drafter", "oracle", "--oracle-p", "0.7",
                      "--budget", "auto", "--cost-curve", str(curve), "--tokens", "12", "--json")
    res = json.loads(out)
    assert rc == 0 and res["tokens"] == [int(t) for t in read_bundle(TINY).golden[:12]]
    assert {r["tree_size"] for r in res["rounds"]} <= {1, 2, 4, 8}


@pytest.mark.slow
def test_numba_backend_ar_runs_in_a_fresh_process():
    """The CLI picks the simulator itself when no GPU is present (env var unset in the child)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    p = subprocess.run([sys.executable, "-m", "workbench", "generate", TINY, "--backend", "numba",
                        "--tokens", "2",
                        "--json"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [int(t) for t in read_bundle(TINY).golden[:2]]


@pytest.mark.parametrize("mode", [
    ["--mode", "ar"],
    pytest.param(["--mode", "ddtree", "--drafter", "oracle", "--budget", "2"], marks=pytest.mark.slow)])
def test_numba_backend_samples_like_the_reference(capsys, mode):
    """--temperature 1: the engine draws from the reference's Generator, so the tokens agree per seed."""
    argv = [TINY, "--prompt", "5,6,7", "--tokens", "3", "--temperature", "1.0", "--seed", "4", *mode]
    rc, out, err = _run(capsys, *argv, "--backend", "numba")
    assert rc == 0, err
    assert "numba engine in numba's CUDA simulator" in err                 # says where the kernels ran
    rc, ref, err = _run(capsys, *argv, "--backend", "reference")
    assert rc == 0, err
    assert "numpy reference" in err
    assert out.split() == ref.split() and len(ref.split()) == 3


@pytest.mark.parametrize("argv", [
    ["--mode", "ddtree", "--drafter", "medusa"],
    ["--mode", "ddtree", "--budget", "0"],
    ["--mode", "ddtree", "--budget", "many"],
    ["--mode", "ddtree", "--budget", "auto"],
    ["--mode", "ddtree", "--budget", "auto", "--cost-curve", "/nonexistent/curve.json"],
    ["--mode", "ddtree", "--budget", "4", "--cost-curve", "/nonexistent/curve.json"],
    ["--prompt", "1,2,100000"],
    ["--prompt", "1,,2"],
    ["--prompt", "a,b"],
    ["--tokens", "0"],
    ["--backend", "numba", "--temperature", "-1"],
    ["--mode", "ddtree", "--budget", "1000000"],
])
def test_bad_input_is_one_line_exit_2(capsys, argv):
    rc, out, err = _run(capsys, TINY, *argv)
    assert rc == 2
    assert err.startswith("error:") and err.count("\n") == 1


def test_dflash_without_drafter_weights_is_exit_2(capsys, tmp_path):
    b = read_bundle(TINY)
    tensors = {k: np.asarray(v) for k, v in b.tensors.items() if not k.startswith("drafter.")}
    path = tmp_path / "nodrafter.kdtr"
    write_bundle(path, config=b.config, tensors=tensors, prompt=b.prompt, golden=b.golden, margins=b.margins,
                 meta=dict(b.meta))
    rc, out, err = _run(capsys, str(path), "--mode", "ddtree", "--drafter", "dflash")
    assert rc == 2 and "drafter" in err and err.count("\n") == 1


def test_ddtree_summary_line(capsys):
    rc, out, err = _run(capsys, TINY, "--mode", "ddtree", "--drafter", "oracle", "--budget", "4",
                        "--tokens", "12")
    assert rc == 0
    line = next(ln for ln in err.splitlines() if ln.startswith("ddtree on the numpy reference"))
    assert re.search(r"12 tokens in [\d.]+ s, [\d.]+ tokens/s; \d+ rounds, tau \d+\.\d\d tokens per", line)


def test_check_ar_passes_and_fails_with_one_line(capsys, monkeypatch):
    argv = [TINY, "--mode", "ddtree", "--drafter", "oracle", "--budget", "4", "--tokens", "10", "--check-ar"]
    rc, out, err = _run(capsys, *argv)
    assert rc == 0 and "check-ar: equal to greedy AR" in err
    import workbench.generate
    real = workbench.generate.generate

    def off_by_one_at_3(*a, **kw):                                        # a DDTree that parts from AR
        res = real(*a, **kw)
        if kw.get("mode") == "ddtree":
            res.tokens[3] = (res.tokens[3] + 1) % 512
        return res

    monkeypatch.setattr(workbench.generate, "generate", off_by_one_at_3)
    rc, out, err = _run(capsys, *argv)
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]   # after the summary, one line
    assert rc == 1 and len(errors) == 1 and errors[0].startswith("error: not equal to greedy AR")
    assert "first difference at step 3" in errors[0] and "margin there" in errors[0]
    rc, out, err = _run(capsys, TINY, "--check-ar", "--temperature", "1")
    assert rc == 2 and "--check-ar" in err


def test_invalid_utf8_text_is_one_line_exit_2(capsys):
    """Invalid UTF-8 bytes in argv arrive as lone surrogates (os.fsdecode), which no tokenizer accepts."""
    code = Path(__file__).resolve().parents[2] / "models" / "code.kdtr"
    rc, out, err = _run(capsys, str(code), "--text", os.fsdecode(b"def \xff\xfe(x):"), "--tokens", "2")
    assert rc == 2 and "--text is not valid UTF-8" in err and err.count("\n") == 1


def test_subnormal_temperature_decodes_like_greedy(capsys):
    greedy = _run(capsys, TINY, "--tokens", "4", "--json")
    cold = _run(capsys, TINY, "--tokens", "4", "--json", "--temperature", "1e-320")
    assert cold[0] == 0 and json.loads(cold[1]) == json.loads(greedy[1])
    assert cold[2].count("\n") == 1 and cold[2].startswith("ar on the numpy reference")   # the summary only

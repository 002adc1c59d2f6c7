"""``python -m workbench inspect``: summary text and JSON, divergence from meta["fp32_golden"], and the
validator contract (exit 0 valid, exit 2 with one ``error:`` line for a bad bundle)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import cli
from workbench.bundle import read_bundle, write_bundle
from workbench.reference.generate import divergence

from .kdtr_corpus import small_inputs

ROOT = Path(__file__).resolve().parents[2]


def _bundle(tmp_path, **meta) -> Path:
    p = tmp_path / "b.kdtr"
    write_bundle(p, **dict(small_inputs(), meta=dict(small_inputs()["meta"], **meta)))
    return p


def test_text_summary(tmp_path, capsys):
    p = _bundle(tmp_path, fp32_golden=[5, 6, 9, 8])
    assert cli.main(["inspect", str(p)]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and re.search(r"^  vocab_size +512$", out, re.M) and "8 tensors" in out
    names = [e.name for e in read_bundle(p).entries if e.name in read_bundle(p).tensors]
    assert all(re.search(rf"^  {re.escape(n)} +\w+ +\S+ ", out, re.M) for n in names)  # every tensor
    assert "1 quantized matrices, group size 32" in out
    assert "prompt      3 tokens: [1, 2, 3]" in out
    min_line = next(line for line in out.splitlines() if "<-- min margin" in line)
    assert min_line.split()[:3] == ["1", "6", "0.250000"]
    assert "first divergence at step 2" in out and "seed=1234" in out


def test_json_summary(tmp_path, capsys):
    p = _bundle(tmp_path, fp32_golden=[5, 6, 7, 8])
    assert cli.main(["inspect", str(p), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["golden"] == [5, 6, 7, 8] and s["margins"] == [1.5, 0.25, 3.0, 2.0]
    assert s["min_margin"] == {"step": 1, "value": 0.25} and s["fp32_golden_divergence"] is None
    assert s["int4"] == {"matrices": 1, "group_sizes": [32]} and s["tensors"]["count"] == 8
    assert s["tensors"]["largest"][0]["name"] == "a" and s["config"]["vocab_size"] == 512
    assert len(s["tensors"]["table"]) == s["tensors"]["count"] == 8
    assert s["tensors"]["total_bytes"] == sum(s["tensors"]["bytes_by_dtype"].values())
    assert s["provenance"]["format_version"] == "1.0"


def test_divergence():
    assert divergence([1, 2, 3], [1, 2, 3]) is None
    assert divergence([1, 2, 3], [1, 5, 3]) == 1
    assert divergence([1, 2, 3], [1, 2]) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "missing", "directory", "bad_meta"])
def test_bad_bundles_exit_2_with_one_line(tmp_path, capsys, damage):
    p = _bundle(tmp_path, **({"fp32_golden": "oops"} if damage == "bad_meta" else {}))
    raw = p.read_bytes()
    if damage == "truncate":
        p.write_bytes(raw[:-1])
    elif damage == "flip":
        p.write_bytes(raw[:100] + bytes([raw[100] ^ 4]) + raw[101:])
    elif damage == "missing":
        p = tmp_path / "nope.kdtr"
    elif damage == "directory":
        p = tmp_path
    assert cli.main(["inspect", str(p)]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.startswith("error: ") and cap.err.count("\n") == 1, cap.err
    want = f"no such file: {p}" if damage == "missing" else "invalid KDTR bundle ["
    assert want in cap.err


def test_real_entry_point(tmp_path):
    """The installed command line, end to end (needs every registered command module to import)."""
    p = _bundle(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    ok = subprocess.run([sys.executable, "-m", "workbench", "inspect", str(p), "--json"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(ok.stdout)["golden"] == [5, 6, 7, 8]
    p.write_bytes(p.read_bytes() + b"PK")
    bad = subprocess.run([sys.executable, "-m", "workbench", "inspect", str(p)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "[trailing_bytes]" in bad.stderr

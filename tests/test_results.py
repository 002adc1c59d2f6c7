"""Result-set names (workbench/results.py) and the bench command's log and clean-up, without a GPU:
the benchmark runners are replaced by stand-ins that write a set the way the real ones do."""

from __future__ import annotations

import argparse
import json

import pytest

from workbench import results
from workbench.results import commit_token, current_set, result_set, result_sets, retire_others


def _write_set(folder, bench, sha, time_utc, suffixes=(".csv", ".json", ".png", ".log")):
    rs = result_set(folder, bench, sha)
    for suf in suffixes:
        p = rs.path(suf)
        p.write_text(json.dumps({"git_sha": sha, "time_utc": time_utc}) if suf == ".json" else "x\n")
    return rs


def test_names_carry_benchmark_and_commit(tmp_path):
    rs = result_set(tmp_path, "kernels", "dca7e65")
    assert [p.name for p in (rs.csv, rs.meta, rs.plot, rs.log)] == [
        "kernels_dca7e65.csv", "kernels_dca7e65.json", "kernels_dca7e65.png", "kernels_dca7e65.log"]
    assert commit_token("dca7e65-dirty") == "dca7e65-dirty"
    assert commit_token("v1/x_y z") == "v1-x-y-z" and commit_token("") == "unknown"
    with pytest.raises(ValueError, match="unknown benchmark"):
        result_set(tmp_path, "kernel", "abc")
    assert result_set(tmp_path, "engine", "abc").read_meta() == {}


def test_current_set_is_the_newest_run(tmp_path):
    assert current_set(tmp_path / "missing", "kernels") is None and current_set(tmp_path, "engine") is None
    _write_set(tmp_path, "kernels", "bbb2222", "2001-01-01T00:00:00+00:00")
    _write_set(tmp_path, "kernels", "aaa1111", "2002-01-01T00:00:00+00:00")
    _write_set(tmp_path, "engine", "ccc3333", "2003-01-01T00:00:00+00:00")
    (tmp_path / "kernels_notes_x.csv").write_text("not a set: the commit token has no '_'\n")
    assert [s.commit for s in result_sets(tmp_path, "kernels")] == ["aaa1111", "bbb2222"]
    assert current_set(tmp_path, "kernels").commit == "aaa1111"
    assert current_set(tmp_path, "engine").commit == "ccc3333"
    (tmp_path / "kernels_aaa1111.json").write_text("{broken")
    assert current_set(tmp_path, "kernels").commit == "bbb2222"      # unreadable metadata sorts first


def test_retire_others_removes_only_earlier_sets_of_the_same_benchmark(tmp_path):
    old = _write_set(tmp_path, "kernels", "old1111", "2001-01-01T00:00:00+00:00")
    new = _write_set(tmp_path, "kernels", "new2222", "2002-01-01T00:00:00+00:00")
    eng = _write_set(tmp_path, "engine", "old1111", "2001-01-01T00:00:00+00:00")
    keep = [tmp_path / "kernels_old1111.txt", tmp_path / "gpu_tier_kernels_old1111.log"]
    for p in keep:
        p.write_text("kept\n")
    gone = retire_others(new)
    assert sorted(p.name for p in gone) == sorted(old.path(s).name for s in results.SUFFIXES)
    assert all(new.path(s).is_file() and eng.path(s).is_file() for s in results.SUFFIXES)
    assert all(p.is_file() for p in keep)


@pytest.mark.parametrize("what", ["kernels", "engine"])
def test_bench_command_writes_the_log_and_retires_the_earlier_set(tmp_path, monkeypatch, capsys, what):
    from kernels_numba import device
    from workbench.bench import common, engine, kernels, kernels_summary
    from workbench.commands import bench

    old = _write_set(tmp_path, what, "old1111", "2001-01-01T00:00:00+00:00")

    def fake_run(out, progress=None):
        rs = result_set(out, what, "new2222")
        print("measured one row")
        rs.csv.write_text("case,impl\nc,a\n")
        rs.meta.write_text(json.dumps({"git_sha": "new2222", "time_utc": "2002-01-01T00:00:00+00:00",
                                       "copy_gbs": 1.0}))
        return {"rows": [], "meta": {"copy_gbs": 1.0}, "log": [], "set": rs} if what == "kernels" else rs

    monkeypatch.setattr(common, "require_gpu", lambda: None)
    monkeypatch.setattr(device, "SIMULATED", False)           # the one switch, whatever was imported first
    monkeypatch.setattr(kernels, "run", fake_run)
    monkeypatch.setattr(kernels_summary, "summary", lambda rows, copy: "targets table")
    monkeypatch.setattr(engine, "run_engine_bench", fake_run)
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    assert bench.run(p.parse_args([what, "--out", str(tmp_path)])) == 0
    new = result_set(tmp_path, what, "new2222")
    log = new.log.read_text()
    assert "measured one row" in log and ("targets table" in log) == (what == "kernels")
    assert "measured one row" in capsys.readouterr().out                # the console still sees it
    assert not any(old.path(s).exists() for s in results.SUFFIXES)
    assert current_set(tmp_path, what) == new

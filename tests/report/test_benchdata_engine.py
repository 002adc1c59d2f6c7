"""Engine benchmark results (enginedata) and the kernel-set finder next to them (benchdata), against
a small engine result set written here in the layout ``python -m workbench bench engine`` writes."""

from __future__ import annotations

import csv
import json
import math
import sys

import pytest

from workbench.errors import InputError
from workbench.report import benchdata, enginedata

COLS = ["section", "model", "impl", "tokens", "tok_s", "us_per_token", "golden_ok", "kernels_per_token",
        "kernel_sum_us", "ratio", "launches_per_token", "us", "us_per_launch", "budget", "rows", "topk_us",
        "build_us", "p", "speedup", "tau", "rounds", "us_per_round", "tokens_equal_ar"]
ROWS = [
    dict(section="ar", model="m", impl="engine", tokens=255, tok_s=2000.0, us_per_token=500.0,
         golden_ok="True"),
    dict(section="ar", model="m", impl="hf_eager", tokens=63, tok_s=80.0, us_per_token=12500.0,
         golden_ok="True"),
    dict(section="ar", model="q", impl="engine", tokens=255, tok_s=2500.0, us_per_token=400.0,
         golden_ok="False"),
    dict(section="kernel_sum", model="m", impl="engine", us_per_token=500.0, kernels_per_token=5,
         kernel_sum_us=400.0, ratio=1.25),
    dict(section="kernel_breakdown", model="m", impl="small_kernel", launches_per_token=4, us=100.0,
         us_per_launch=25.0),
    dict(section="kernel_breakdown", model="m", impl="big_kernel", launches_per_token=1, us=300.0,
         us_per_launch=300.0),
    dict(section="verify", model="m", us=600.0, budget=4, rows=5, topk_us=40.0, build_us=1.0),
    dict(section="verify", model="m", us=400.0, budget=0, rows=1),
    dict(section="verify", model="m", us=800.0, budget=16, rows=17, topk_us=40.0, build_us=5.0),
    dict(section="spec", model="m", impl="ar", tokens=11, tok_s=1000.0),
    dict(section="spec", model="m", impl="ddtree", tokens=11, tok_s=3000.0, budget=8, p=1.0, speedup=3.0,
         tau=6.0, rounds=2, us_per_round=2000.0, tokens_equal_ar="True"),
    dict(section="spec", model="m", impl="ddtree", tokens=11, tok_s=1500.0, budget=2, p=0.5, speedup=1.5,
         tau=2.75, rounds=4, us_per_round=1833.0, tokens_equal_ar="False"),
    dict(section="spec", model="m", impl="ddtree", tokens=11, tok_s=2000.0, budget=2, p=1.0, speedup=2.0,
         tau=3.0, rounds=4, us_per_round=1500.0, tokens_equal_ar="True"),
]
META = {"gpu": "Test GPU (synthetic, not a measurement)", "time_utc": "2001-02-03T04:05:06+00:00",
        "spec_tokens": 12}


def write(d, rows=ROWS, meta=META, cols=COLS, commit="abc1234"):
    with open(d / f"engine_{commit}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    if meta is not None:
        (d / f"engine_{commit}.json").write_text(json.dumps(meta))


def test_load_and_sections(tmp_path):
    assert enginedata.load_engine(tmp_path) is None
    write(tmp_path)
    res = enginedata.load_engine(tmp_path)
    assert res.hardware == META["gpu"] and res.date == "2001-02-03 04:05 UTC"
    assert [r["impl"] for r in res.section("ar", "m")] == ["engine", "hf_eager"]
    assert res.section("ar")[0]["golden_ok"] is True and res.section("ar")[0]["budget"] is None
    assert res.models("ar") == ["m", "q"] and res.models("verify") == ["m"]
    with pytest.raises(InputError, match="unknown engine section"):
        res.section("nope")
    write(tmp_path, meta=None)
    (tmp_path / "engine_abc1234.json").unlink()
    res = enginedata.load_engine(tmp_path)
    assert res.meta == {} and res.hardware == "unknown GPU" and res.date == "unknown date"
    write(tmp_path, meta={"time_utc": "last tuesday"})
    assert enginedata.load_engine(tmp_path).date == "last tuesday"
    write(tmp_path, meta={"time_utc": "2001-02-03T06:05:06+02:00"})
    assert enginedata.load_engine(tmp_path).date == "2001-02-03 04:05 UTC"
    write(tmp_path, meta={"time_utc": "2001-02-03T04:05:06"})
    assert enginedata.load_engine(tmp_path).date == "2001-02-03 04:05 UTC"


def test_bad_files_are_rejected(tmp_path):
    write(tmp_path, rows=[dict(section="warp", model="m")])
    with pytest.raises(InputError, match="unknown sections"):
        enginedata.load_engine(tmp_path)
    write(tmp_path, rows=[dict(section="ar")], cols=["section", "impl"])
    with pytest.raises(InputError, match="'section' and 'model'"):
        enginedata.load_engine(tmp_path)


def test_ar_kernel_and_verify_tables(tmp_path):
    write(tmp_path)
    res = enginedata.load_engine(tmp_path)
    ar = {(r["model"], r["impl"]): r for r in enginedata.ar_table(res)}
    assert ar[("m", "engine")]["x_over_hf_eager"] == 25.0 and ar[("m", "hf_eager")]["x_over_hf_eager"] == 1.0
    assert ar[("q", "engine")]["x_over_hf_eager"] is None and ar[("q", "engine")]["golden_ok"] is False
    [ks] = enginedata.kernel_sum_table(res)
    assert (ks["us_per_token"], ks["kernel_sum_us"], ks["step_over_kernel_sum"]) == (500.0, 400.0, 1.25)
    kb = enginedata.kernel_breakdown(res, "m")
    assert [r["kernel"] for r in kb] == ["big_kernel", "small_kernel"]
    assert [r["share_pct"] for r in kb] == [75.0, 25.0]
    assert enginedata.kernel_breakdown(res, "q") == []
    assert enginedata.ar_us_per_token(res, "m") == 500.0 and enginedata.ar_us_per_token(res, "zz") is None
    ver = enginedata.verify_table(res, "m")
    assert [r["budget"] for r in ver] == [0, 4, 16]
    assert [r["x_decode_step"] for r in ver] == [1.0, 1.5, 2.0]
    assert ver[1]["topk_us"] == 40.0 and ver[2]["build_us"] == 5.0


def test_spec_settings_and_table(tmp_path):
    write(tmp_path)
    res = enginedata.load_engine(tmp_path)
    assert enginedata.spec_settings(res) == ("m", 12, [2, 8], [0.5, 1.0])
    rows = enginedata.spec_table(res, "m", {(1.0, 8): 6.0, (1.0, 2): 2.5})
    assert [(r["budget"], r["oracle_p"]) for r in rows] == [(2, 0.5), (2, 1.0), (8, 1.0)]
    by = {(r["budget"], r["oracle_p"]): r for r in rows}
    assert by[(8, 1.0)]["speedup"] == 3.0 and enginedata.spec_ar_tok_s(res, "m") == 1000.0
    assert by[(8, 1.0)]["same_tau"] is True and by[(2, 1.0)]["same_tau"] is False
    assert by[(2, 0.5)]["tau_ref"] is None and by[(2, 0.5)]["same_tau"] is None
    # tau_ref x AR us/token / us per round: 6 * 1000 / 2000 = 3, 2.5 * 1000 / 1500
    assert by[(8, 1.0)]["speedup_ref_tau"] == 3.0
    assert math.isclose(by[(2, 1.0)]["speedup_ref_tau"], 2.5 / 1.5)
    assert by[(2, 0.5)]["speedup_ref_tau"] is None and by[(2, 0.5)]["same_tokens_as_ar"] is False
    assert all(r["tau_ref"] is None for r in enginedata.spec_table(res, "m"))
    assert [(r["oracle_p"], r["budget"]) for r in enginedata.best_budget(rows)] == [(0.5, 2), (1.0, 8)]
    with pytest.raises(InputError, match="no AR row"):
        enginedata.spec_table(res, "q")


def test_spec_settings_without_meta_or_rows(tmp_path):
    write(tmp_path, meta={})
    assert enginedata.spec_settings(enginedata.load_engine(tmp_path))[1] == 12     # tokens + 1
    write(tmp_path, rows=ROWS[:3])
    with pytest.raises(InputError, match="no DDTree rows"):
        enginedata.spec_settings(enginedata.load_engine(tmp_path))


def test_kernel_finder_skips_engine_files(tmp_path):
    write(tmp_path)
    assert benchdata.find_results(tmp_path) == []          # only an engine set here
    (tmp_path / "kernels_abc1234.csv").write_text("case,impl,M,gbs\nc M=1,a,1,10.0\n")
    (tmp_path / "kernels_abc1234.json").write_text(json.dumps({"gpu": "K"}))
    (tmp_path / "kernels_notes.txt").write_text("not a result set")
    [(path, meta)] = benchdata.find_results(tmp_path)
    assert path.name == "kernels_abc1234.csv" and meta == {"gpu": "K"}
    (tmp_path / "kernels_abc1234.json").unlink()
    [(path, meta)] = benchdata.find_results(tmp_path)     # the engine set's JSON is not used
    assert meta == {}


def test_the_newest_set_is_current(tmp_path):
    write(tmp_path, meta={**META, "time_utc": "2001-01-01T00:00:00+00:00"}, commit="old1111")
    write(tmp_path, rows=ROWS[:3], meta={**META, "time_utc": "2002-01-01T00:00:00+00:00"}, commit="new2222")
    res = enginedata.load_engine(tmp_path)
    assert res.path.name == "engine_new2222.csv" and len(res.rows) == 3


def test_rerun_runs_the_bench_command(tmp_path, monkeypatch):
    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return type("R", (), {"returncode": 2, "stdout": "x\n", "stderr": "no GPU\n"})()

    monkeypatch.setattr(benchdata.subprocess, "run", fake_run)
    assert benchdata.rerun(tmp_path, what="engine") == (False, "x\nno GPU")
    assert seen == [[sys.executable, "-m", "workbench", "bench", "engine", "--out", str(tmp_path)]]
    with pytest.raises(InputError, match="'kernels' or 'engine'"):
        benchdata.rerun(tmp_path, what="all")

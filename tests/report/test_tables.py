"""CSV at full precision beside rounded HTML tables; benchmark CSV reading."""

from __future__ import annotations

import csv
import json

import numpy as np

from workbench.report import benchdata, tables


def test_csv_keeps_full_precision(tmp_path):
    x = 0.1 + 0.2
    rows = [{"a": x, "b": np.float64(1 / 3), "c": None, "n": 7}, {"a": 1e-300, "d": [1, 2], "n": None}]
    tables.write_csv(rows, tmp_path / "t.csv")
    back = list(csv.DictReader(open(tmp_path / "t.csv")))
    assert float(back[0]["a"]) == x and float(back[0]["b"]) == 1 / 3 and float(back[1]["a"]) == 1e-300
    assert back[0]["c"] == "" and back[0]["d"] == "" and back[1]["d"] == "[1, 2]"
    assert [r["n"] for r in back] == ["7", ""]             # an int column with a gap stays ints
    assert list(back[0]) == ["a", "b", "c", "n", "d"]     # keys in first-seen order
    assert not list(tmp_path.glob(".*.tmp"))              # written through the atomic writer


def test_frame_types_columns_and_passes_frames_through():
    df = tables.frame([{"k": 1, "x": 0.5, "s": "a", "ok": True},
                       {"k": None, "x": None, "s": "b", "ok": False}])
    assert str(df["k"].dtype) == "Int64" and df["x"].dtype == np.float64 and df["ok"].dtype == bool
    assert tables.frame(df) is df and tables.frame([]).shape == (0, 0)


def test_html_is_rounded_and_escaped():
    html = tables.styled([{"x": 3.14159265, "name": "<b>", "k": 12345678}], digits=3, caption="a < b",
                         name="01_t").to_html()
    assert "3.14<" in html and "3.1415" not in html and "&lt;b&gt;" in html and "<b>" not in html
    assert ">12345678<" in html and "a &lt; b" in html and 'id="T_01_t"' in html   # ints whole; stable ids
    assert tables.fmt(float("nan")) == "" and tables.fmt([1.23456, 2]) == "1.235 2" and tables.fmt(None) == ""
    assert tables.fmt(np.float32(0.1)) == "0.1" and tables.fmt(True) == "True"
    assert tables.fmt(50000.0) == "50000" and tables.fmt(26469.3) == "26469" and tables.fmt(1e20) == "1e+20"


def test_bench_results(tmp_path):
    (tmp_path / "kernels_abc1234.csv").write_text(
        "case,impl,M,gbps,pct_copy\nc,a,4,2000.0,50\nc,a,1,1000,25\nc,b,1,3000,75\n"
    )
    (tmp_path / "kernels_abc1234.json").write_text(json.dumps({"gpu": "X"}))
    [(path, meta)] = benchdata.find_results(tmp_path)
    rows = benchdata.read_csv(path)
    assert meta == {"gpu": "X"} and rows[0]["M"] == 4 and rows[0]["gbps"] == 2000.0
    assert benchdata.column(rows, "impl") == "impl" and benchdata.column(rows, "nope") is None
    assert benchdata.copy_gbps(meta, rows) == 4000.0  # gbps / (pct_copy / 100)
    assert benchdata.copy_gbps({"copy_gbps": 4100}, rows) == 4100.0
    assert benchdata.series(rows, "M", "gbps", "impl") == {"a": ([1, 4], [1000, 2000.0]), "b": ([1], [3000])}
    assert benchdata.series([{"impl": "a", "M": "", "gbps": 1.0}], "M", "gbps", "impl") == {}
    assert [benchdata.family(c) for c in ("gate_up M=16", "moe T=4", "down copy ceiling", "x")] == [
        "gate_up",
        "moe",
        "down",
        "x",
    ]
    fams = benchdata.families([{"case": "d M=1"}, {"case": "moe T=1"}, {"case": "d copy ceiling"}], "case")
    assert {k: len(v) for k, v in fams.items()} == {"d": 2, "moe": 1}
    assert benchdata.is_ceiling({"case": "d copy ceiling"}, "case") and not benchdata.is_ceiling(
        fams["moe"][0], "case"
    )
    assert benchdata.find_results(tmp_path / "missing") == []
    assert benchdata.matmul_bytes(1, 2048, 7168, "bf16") == 2048 * 7168 * 2 + 2 * 7168 + 2 * 2048
    assert (
        benchdata.matmul_bytes(1, 2048, 7168, "int4", 32)
        == 2048 * 7168 * (0.5 + 2 / 32) + 2 * 7168 + 2 * 2048
    )


def test_show_and_save_write_the_full_table_and_display_the_view(tmp_path, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    rows = [{"p": p, "b": b, "tau": p * b + 1 / 3} for p in (0.5, 1.0) for b in (1, 4, 16)]
    df = tables.frame(rows)
    tables.show_table(df, "05_x", tmp_path, caption="τ by p and budget",
                      view=df.pivot(index="p", columns="b", values="tau"))
    assert len(list(csv.DictReader(open(tmp_path / "data" / "05_x.csv")))) == 6   # every row in the CSV
    note, table = (s.to_html() if hasattr(s, "to_html") else s.data for s in shown)
    assert "τ by p and budget" in note and 'href="data/05_x.csv"' in note
    assert table.count("<tr>") == 1 + 1 + 2 and ">16.33<" in table and ">0.5<" in table  # 2 x 3 pivot
    shown.clear()
    tables.save_table(rows, "05_y", tmp_path, "The curve's points")
    assert (tmp_path / "data" / "05_y.csv").is_file() and "6 rows in [`data/05_y.csv`]" in shown[0].data

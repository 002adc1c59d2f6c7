"""The answer on top of the index page: with a bench depth set (a small fixture in its format, made-up
times), measured beside projected; without one, a plain "not measured yet" line and the projection alone;
and in the page, the answer (table and figure) before any parameter or provenance."""

from __future__ import annotations

import argparse
import html
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.report.depth_fixture import write_depth_set
from workbench import k2proj
from workbench.commands import report
from workbench.config import preset
from workbench.fileio import write_json_atomic
from workbench.report import depthdata, headline, index
from workbench.results import result_set, write_csv

COMMITTED = Path(__file__).resolve().parents[2] / "reports" / "bench"


class Outline(HTMLParser):
    """Start tags in document order as (tag, id, class, data-kind), and the text under each <th>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, str, str, str]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a.get("id") or "", a.get("class") or "", a.get("data-kind") or ""))


def outline(text: str) -> list[tuple[str, str, str, str]]:
    p = Outline()
    p.feed(text)
    return p.tags


def first(tags, tag: str, id_: str = "") -> int:
    return next(i for i, t in enumerate(tags) if t[0] == tag and (not id_ or t[1] == id_))


def page(tmp_path: Path, bench: Path) -> str:
    h = headline.write(tmp_path, bench, shown="reports/bench")
    manifest = {"profile": "smoke", "kernel": "python3", "cell_timeout_s": 1, "wall_timeout_s": 1,
                "provenance": {"git": {"sha": "0" * 40, "dirty": False}, "gpus": []}, "headline": h,
                "notebooks": [{"name": "05_ddtree_budget", "status": "ok", "reason": "", "duration_s": 1.0,
                               "parameters": {"budgets": [1, 4]}, "ipynb": None,
                               "html": "05_ddtree_budget.html", "log": "logs/05.log"}], "pending": []}
    return index.render_index(manifest)


def words(text: str) -> str:
    return html.unescape(text)


def test_with_a_depth_set_the_page_opens_with_measured_beside_projected(tmp_path):
    bench = tmp_path / "bench"
    write_depth_set(bench)
    text = page(tmp_path / "out", bench)
    tags = outline(text)
    answer, details = first(tags, "section", "answer"), first(tags, "details", "run-details")
    table, fig = first(tags, "table", "headline"), first(tags, "img", "headline-figure")
    assert first(tags, "h1") < answer < table < details and answer < fig < details
    assert details < first(tags, "table", "notebooks") and details < first(tags, "table", "provenance")
    assert all(t[0] != "h2" for t in tags[:answer])                   # nothing but the title before it
    head = [t for t in tags[table:fig] if t[0] == "th"]
    assert {"measured", "projected"} <= {t[2] for t in head}
    cells = [t for t in tags[table:fig] if t[0] == "td"]
    assert sum(t[3] == "measured" for t in cells) and sum(t[3] == "projected" for t in cells)
    assert "not-measured" not in text and "NVIDIA H200, commit abc1234" in text
    assert "random weights (not K2's)" in words(text) and "10 distinct MoE weight sets" in text
    assert "parameters" not in text[:text.index('<details id="run-details"')].lower()
    assert (tmp_path / "out" / "figures" / "00_headline.png").stat().st_size > 5000
    csv = (tmp_path / "out" / "data" / "00_headline.csv").read_text().splitlines()[0]
    assert "tokens/s (measured)" in csv and "tokens/s (projected)" in csv


def test_without_a_depth_set_it_says_not_measured_and_shows_the_projection_only(tmp_path):
    bench = tmp_path / "bench"                                       # the committed sets less any k2_depth
    bench.mkdir()
    for f in COMMITTED.iterdir():
        if f.is_file() and not f.name.startswith("k2_depth_"):
            shutil.copy(f, bench / f.name)
    text = page(tmp_path / "out", bench)
    tags = outline(text)
    answer, missing = first(tags, "section", "answer"), first(tags, "p", "not-measured")
    assert answer < missing < first(tags, "table", "headline") < first(tags, "details", "run-details")
    assert "Not measured yet: no k2_depth result set in reports/bench" in text
    heads = [t for t in tags if t[0] == "th" and t[2]]
    assert heads and {t[2] for t in heads} <= {"projected", "measured"}
    assert not any(t[3] == "measured" and "tok" in t[1] for t in tags)
    h = headline.build(bench)
    assert h["status"] == "projected" and all("measured_tok_s" not in r for r in h["rows"])
    sources = {r["source"] for r in h["rows"]}
    assert sources >= {"AR (no tree)", "DDTree, oracle p=0.8", "DDTree, trained code pair"}
    assert any(lab.startswith("PROJECTED") and "commit" in lab for lab in h["labels"])


def test_a_dry_run_set_is_never_shown_as_a_result(tmp_path):
    bench = tmp_path / "bench"
    write_depth_set(bench)
    csv = next(bench.glob("k2_depth_*.csv"))
    meta = json.loads(csv.with_suffix(".json").read_text())
    write_json_atomic(csv.with_suffix(".json"), {**meta, "git_sha": "dry-run", "time_utc": "dry-run"})
    h = headline.build(bench)
    assert h["status"] != "measured" and "dry run" in h["not_measured"]


def test_side_by_side_is_the_projection_of_the_sets_own_parts(tmp_path):
    write_depth_set(tmp_path)
    ds = depthdata.load_depth(tmp_path)
    rows = depthdata.side_by_side(ds)
    proj = {(r["source"], r["budget"]): r
            for r in k2proj.project_depth(preset("k2_6"), ds.parts(), ds.runs())}
    assert len(rows) == 1 + 3 * 3 and {r["source"] for r in rows} == {"ar", "oracle p=0.8", "oracle p=0.5",
                                                                      "pair code (replayed)"}
    ar = next(r for r in rows if r["source"] == "ar")
    assert ar["measured_ms_per_token"] == 14.0 and ar["measured_speedup"] == 1.0
    # AR's projection by hand: embed + step rows + dense + 60 MoE layers + lm_head at 1 row
    assert ar["projected_ms_per_token"] == pytest.approx((4 + 6 + 300 + 60 * 208 + 521) / 1e3)
    for r in rows:
        p = proj[(r["source"], r["budget"])]
        assert r["projected_ms_per_token"] == p["projected_ms_per_token"]
        ratio = r["measured_ms_per_token"] / p["projected_ms_per_token"]
        assert r["measured_over_projected"] == pytest.approx(ratio)
        assert r["measured_tok_s"] == pytest.approx(1e3 / r["measured_ms_per_token"])


def test_the_split_adds_up_to_the_projected_round(tmp_path):
    write_depth_set(tmp_path)
    ds = depthdata.load_depth(tmp_path)
    split = {r["budget"]: r for r in depthdata.split(ds)}
    assert sorted(split) == [0, 1, 4, 8]
    for b, r in split.items():
        assert sum(r[k] for k in depthdata.SPLIT_PARTS) == pytest.approx(r["projected_round_ms"])
        oracle = [p for p in k2proj.project_depth(preset("k2_6"), ds.parts(), ds.runs())
                  if p["budget"] == b and (b == 0 or p["source"].startswith("oracle"))]
        mean = sum(p["projected_round_ms"] for p in oracle) / len(oracle)
        assert r["projected_round_ms"] == pytest.approx(mean)
    assert split[0]["drafter"] == 0.0 and split[4]["drafter"] == 3.0
    assert split[4]["MoE routed experts"] == pytest.approx(60 * 150 * 1.6 / 1e3)
    assert split[8]["tree build"] == pytest.approx((20 + 280) / 1e3) and split[8]["measured_round_ms"] == 32.0


def test_empty_csv_cells_read_as_missing_not_text(tmp_path):
    """The pair's replayed rows have no host phases: their empty cells must not stop the projection."""
    write_depth_set(tmp_path)
    sbs = k2proj.depth_side_by_side(tmp_path)
    assert sbs is not None and any(r["source"] == "pair code (replayed)" for r in sbs[0])


def test_nothing_to_project_from_is_said_plainly(tmp_path):
    h = headline.build(tmp_path)
    assert h["status"] == "none" and "missing" in h["answer"] and h["rows"] == []
    assert "not-measured" in index.render_index({"profile": "s", "kernel": "k", "cell_timeout_s": 1,
                                                  "wall_timeout_s": 1, "provenance": {}, "headline": h,
                                                  "notebooks": [], "pending": []})


NOTEBOOK = '''# %%
import json

# %% tags=["parameters"]
depth_bench_dir = "reports/bench"
out_dir = "."
profile = "full"

# %%
print(json.dumps(depth_bench_dir))
'''


def test_the_runner_puts_the_answer_of_the_notebooks_bench_folder_on_top(tmp_path):
    """Through the report command: the headline comes from the folder the notebooks' depth_bench_dir names."""
    bench, books, out = tmp_path / "bench", tmp_path / "books", tmp_path / "out"
    write_depth_set(bench, sha="fed4321")
    books.mkdir()
    (books / "one.py").write_text(NOTEBOOK)
    p = argparse.ArgumentParser()
    report.add_arguments(p)
    rc = report.run(p.parse_args(["--notebooks", str(books), "--out", str(out), "--quiet", "--profile",
                                  "smoke", "-p", f"depth_bench_dir={json.dumps(str(bench))}"]))
    assert rc == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["headline"]["status"] == "measured" and manifest["headline"]["figure"]
    text = (out / "index.html").read_text()
    tags = outline(text)
    assert first(tags, "table", "headline") < first(tags, "details", "run-details")
    assert "commit fed4321" in text and (out / manifest["headline"]["figure"]).is_file()


def test_a_set_without_parts_shows_the_measurement_without_a_projection(tmp_path):
    rs = result_set(tmp_path, "k2_depth", "abc1234")
    write_csv([{"table": "run", "source": "ar", "budget": 0, "tau": 1.0, "ms_per_token": 10.0,
                "round_ms": 10.0}], rs.csv)
    write_json_atomic(rs.meta, {"bench": "k2_depth", "git_sha": "abc1234", "time_utc": "x"})
    ds = depthdata.load_depth(tmp_path)
    assert depthdata.split(ds) == []
    (row,) = depthdata.side_by_side(ds)
    assert row["measured_tok_s"] == 100.0 and row["projected_tok_s"] is None
    h = headline.build(tmp_path)
    assert h["status"] == "measured" and h["rows"][0]["measured_tok_s"] == 100.0
    assert "–" in index.render_index({"profile": "s", "kernel": "k", "cell_timeout_s": 1, "wall_timeout_s": 1,
                                      "provenance": {}, "headline": h, "notebooks": [], "pending": []})


@pytest.mark.slow
def check_depth_pages(out: Path) -> list[tuple[bool, str]]:
    """05 and 06 of a smoke report run with ``depth_bench_dir`` on the fixture set (``write_depth_set``;
    ``test_notebooks``' one smoke run passes it): measured beside projected per budget and source, the
    split by part, the cost-aware run, the answer on top of 06, the pair's replayed rows."""
    import csv

    def rows(name):
        with open(out / "data" / f"{name}.csv", newline="") as f:
            return list(csv.DictReader(f))
    sbs, split, head = rows("05_depth_side_by_side"), rows("05_depth_split"), rows("06_headline")
    figures = ("05_depth_split", "06_headline", "00_headline")
    return [
        (len(sbs) == 10 and all(r["measured_ms_per_token"] and r["projected_ms_per_token"] for r in sbs),
         "05: measured beside projected for each of the fixture's 10 runs"),
        ([r["budget"] for r in split] == ["0", "1", "4", "8"] and "MoE routed experts" in split[0],
         "05: the split by part per budget"),
        (all((out / "figures" / f"{n}.png").is_file() for n in figures), "05/06/index: the depth figures"),
        ("tokens/s (measured)" in head[0] and "tokens/s (projected)" in head[0], "06: the answer on top"),
        ({r["source"] for r in rows("06_depth_pair")} == {"ar", "pair code (replayed)"},
         "06: the pair's replayed rows"),
        ("commit abc1234" in (out / "05_ddtree_budget.html").read_text(), "05: the set's commit"),
        ([(r["best_fixed_budget"], r["expected_tau"], r["oracle_hit_rate"])
          for r in rows("05_depth_cost_aware")] == [("4", "3.2", "0.73")],
         "05: the cost-aware run beside its best fixed budget"),
    ]


def test_a_composed_set_says_which_run_gave_what(tmp_path):
    """A set ``dev/depth_compose.py`` made of two runs names both on the page, and what each gave; a
    set of one run says nothing of the kind."""
    bench = tmp_path / "bench"
    write_depth_set(bench)
    assert "Composed" not in words(page(tmp_path / "one", bench))
    meta_path = next(bench.glob("k2_depth_*.json"))
    meta = json.loads(meta_path.read_text())
    meta["runs"] = [{"git_sha": "1111111"}, {"git_sha": "2222222"}]
    meta_path.write_text(json.dumps(meta))
    text = words(page(tmp_path / "two", bench))
    assert "Composed of two runs: the oracle's tau from 1111111" in text
    assert "parts and round times from 2222222" in text


def test_cost_aware_rows_carry_the_stated_and_drawn_acceptance(tmp_path):
    """The cost-aware view: the run beside its best fixed budget, with the E(N) it read and the oracle's
    hit rate for its p, in the fixture and in every cost-aware run of the committed set."""
    write_depth_set(tmp_path)
    (row,) = depthdata.cost_aware(depthdata.load_depth(tmp_path))
    assert row["best_fixed_budget"] == 4 and row["vs_best_fixed"] == pytest.approx(8.67 / 10.5)
    assert (row["tau"], row["expected_tau"], row["oracle_hit_rate"]) == (2.98, 3.2, 0.73)
    committed = depthdata.cost_aware(depthdata.load_depth("reports/bench"))
    assert committed and all(r["best_fixed_ms_per_token"] > 0 and r["oracle_hit_rate"] for r in committed)

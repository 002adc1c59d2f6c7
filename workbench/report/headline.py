"""The workbench's answer, for the top of the index page and of notebook 06: at K2 depth, which DDTree
budget pays off, by how much, measured beside projected.

With a ``bench depth`` set (``depthdata``): per acceptance source (AR, the oracle at each p, the trained
pair's accepted lengths replayed) the best budget by MEASURED speed-up, its measured and projected
tokens/s and both speed-ups. Without one (a fresh clone before the GPU run, or only a dry-run set): the
PROJECTION alone, from the ``bench k2`` layer times and the trained pair's tau(B) (``bench pair``),
labelled as such, and a plain line saying nothing is measured yet.

``build`` returns JSON-able data (it goes into manifest.json); ``figure`` draws tokens/s against the budget.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import k2proj
from ..config import preset
from . import depthdata

CSV_NAME = "00_headline"


def _order(source: str) -> tuple[int, str]:
    return (0 if source == "ar" else 2 if source.startswith("pair") else 1, source)


def _pretty(source: str) -> str:
    if source == "ar":
        return "AR (no tree)"
    if source.startswith("pair"):
        replayed = ", replayed" if "replayed" in source else ""
        return "DDTree, trained code pair" + replayed
    return f"DDTree, {source}"


def build(bench_dir: str | Path, shown: str | None = None) -> dict[str, Any]:
    """{"status": "measured" | "projected" | "none", "answer": one sentence, "labels": [lines naming
    hardware and commit], "columns": [[key, header, kind]], "rows": table rows, "curves": [{source, kind,
    budget: [...], tok_s: [...]}], "hardware", "date": of the measurements} for the current sets in
    ``bench_dir`` (named ``shown`` in the text)."""
    shown = shown or str(bench_dir)
    ds = depthdata.load_depth(bench_dir)
    if ds is not None and not ds.dry_run:
        return _measured(ds)
    out = _projected(bench_dir, shown)
    why = (f"the only k2_depth set in {shown} is a dry run (a tiny config in the CUDA simulator, no "
           "timing): not a result" if ds is not None else f"no k2_depth result set in {shown}")
    out["not_measured"] = (f"Not measured yet: {why}. `python -m workbench bench depth` writes it on a "
                           "GPU. Shown below: the projection only.")
    return out


def _measured(ds: depthdata.DepthSet) -> dict[str, Any]:
    sbs = depthdata.side_by_side(ds)
    sources = sorted({r["source"] for r in sbs}, key=_order)
    rows, curves = [], []
    for s in sources:
        sel = sorted((r for r in sbs if r["source"] == s), key=lambda r: r["budget"])
        best = max(sel, key=lambda r: r["measured_speedup"] or 0.0)
        pays = next((r["budget"] for r in sel if r["budget"] and (r["measured_speedup"] or 0) > 1.0), None)
        rows.append({"source": _pretty(s), "best_budget": best["budget"] if s != "ar" else None,
                     "pays_off_from": pays, "tau": best["tau"],
                     "measured_tok_s": best["measured_tok_s"], "projected_tok_s": best["projected_tok_s"],
                     "measured_over_projected": best["measured_over_projected"],
                     "measured_speedup": best["measured_speedup"],
                     "projected_speedup": best["projected_speedup"]})
        budgets = [r["budget"] for r in sel]
        curves += [{"source": _pretty(s), "kind": "measured", "budget": budgets,
                    "tok_s": [r["measured_tok_s"] for r in sel]},
                   {"source": _pretty(s), "kind": "projected", "budget": budgets,
                    "tok_s": [r["projected_tok_s"] for r in sel]}]
    columns = [["source", "acceptance source", ""], ["best_budget", "best budget B", "measured"],
               ["pays_off_from", "faster than AR from B", "measured"], ["tau", "τ at best B", "measured"],
               ["measured_tok_s", "tokens/s", "measured"], ["projected_tok_s", "tokens/s", "projected"],
               ["measured_over_projected", "measured ÷ projected time", ""],
               ["measured_speedup", "speed-up over AR", "measured"],
               ["projected_speedup", "speed-up over AR", "projected"]]
    return {"status": "measured", "answer": _answer(rows, "measured"), "columns": columns, "rows": rows,
            "curves": curves, "hardware": ds.hardware, "date": f"{ds.date}, commit {ds.commit}", "labels": [
                f"MEASURED: `bench depth` on {ds.hardware}, commit {ds.commit}, {ds.date} ({ds.path.name}): "
                f"the {ds.stand_in}. Its tokens mean nothing and its routing is near uniform (the worst case "
                "for a tree's distinct experts); the oracle's acceptance is set by p, the trained pair's is "
                f"its measured accepted lengths ({ds.meta.get('pair_set') or 'no pair set'}) replayed on "
                f"this stand-in's measured round times. {ds.composition}".rstrip(),
                "PROJECTED: the same set's measured parts (embedding, layers, lm_head, drafter, tree build, "
                f"host) composed into a step (k2proj.project_depth), on {ds.hardware}, commit {ds.commit}."]}


ORACLE_P = (0.5, 0.7, 0.8, 0.9)            # the oracle accuracies bench depth runs


def oracle_tau(bench_dir: str | Path) -> tuple[dict[str, dict[int, float]], str | None]:
    """({"oracle p=0.8": {B: tau}}, where) of the current ``bench engine`` set's DDTree runs with the oracle
    drafter (on its small model: the oracle's acceptance depends on p and the tree, not on the model)."""
    from .enginedata import load_engine
    eng = load_engine(bench_dir)
    if eng is None:
        return {}, None
    out: dict[str, dict[int, float]] = {}
    for r in eng.section("spec"):
        if r.get("impl") == "ddtree" and r.get("p") is not None and float(r["p"]) in ORACLE_P:
            out.setdefault(f"oracle p={float(r['p']):g}", {})[int(r["budget"])] = float(r["tau"])
    return out, f"{eng.path.name}, {eng.hardware}"


def _projected(bench_dir: str | Path, shown: str) -> dict[str, Any]:
    from ..bench.k2_depth import pair_tau  # the acceptance bench depth replays
    layers = k2proj.load_layers(bench_dir)
    pair, pair_set = pair_tau(Path(bench_dir))
    taus, oracle_set = oracle_tau(bench_dir)
    if pair:
        taus["pair"] = pair
    if layers is None or not taus:
        miss = "the bench k2 layer set" if layers is None else "the bench pair and bench engine sets"
        return {"status": "none", "answer": f"Nothing to project from: {miss} is missing in {shown}.",
                "columns": [], "rows": [], "curves": [], "labels": []}
    times, meta = layers
    rows: list[dict[str, Any]] = []
    curves = []
    for src in sorted(taus, key=_order):
        proj = k2proj.project(preset("k2_6"), times, taus[src])
        if not rows:
            rows.append({"source": _pretty("ar"), "best_budget": None, "pays_off_from": None, "tau": 1.0,
                         "projected_tok_s": proj[0]["tok_s"], "projected_speedup": 1.0})
            curves.append({"source": _pretty("ar"), "kind": "projected", "budget": [0],
                           "tok_s": [proj[0]["tok_s"]]})
        best = max(proj, key=lambda r: r["speedup"])
        pays = next((r["budget"] for r in proj if r["budget"] and r["speedup"] > 1.0), None)
        rows.append({"source": _pretty(src), "best_budget": best["budget"], "pays_off_from": pays,
                     "tau": best["tau"], "projected_tok_s": best["tok_s"],
                     "projected_speedup": best["speedup"]})
        curves.append({"source": _pretty(src), "kind": "projected", "budget": [r["budget"] for r in proj],
                       "tok_s": [r["tok_s"] for r in proj]})
    columns = [["source", "acceptance source", ""], ["best_budget", "best budget B", "projected"],
               ["pays_off_from", "faster than AR from B", "projected"], ["tau", "τ at best B", "measured"],
               ["projected_tok_s", "tokens/s", "projected"],
               ["projected_speedup", "speed-up over AR", "projected"]]
    gpu, sha = meta.get("gpu", "?"), str(meta.get("git_sha", "?"))[:7]
    where = [f"the trained code pair's on HumanEval ({pair_set})"] if pair else []
    where += [f"the oracle's at each p on bench engine's small model ({oracle_set})"] if oracle_set else []
    return {"status": "projected", "answer": _answer(rows, "projected"), "columns": columns, "rows": rows,
            "hardware": gpu, "date": f"{depthdata.utc_day(meta.get('time_utc'))}, commit {sha}",
            "curves": curves,
            "labels": [
                "PROJECTED: Kimi-K2.6's 61 layers (1 dense + 60 MoE) at the layer times `bench k2` MEASURED "
                f"on the seeded k2_slice on {gpu}, commit {sha}, {depthdata.utc_day(meta.get('time_utc'))} "
                f"({meta['dense_used']} dense projections), one GPU's bandwidth applied to a model that does "
                "not fit one GPU; embedding, lm_head, the drafter, tree building and the host are left out.",
                f"τ(B), MEASURED: {'; '.join(where)}."]}


def _answer(rows: list[dict[str, Any]], kind: str) -> str:
    """One sentence: per DDTree source its best budget and speed-up (``kind``: measured or projected)."""
    parts = []
    for r in rows:
        if r["best_budget"] is None:
            continue
        s = r[f"{kind}_speedup"]
        src = r["source"].removeprefix("DDTree, ")
        where = "never faster than AR" if r["pays_off_from"] is None else \
            f"faster than AR from B = {r['pays_off_from']}"
        parts.append(f"{src}: best B = {r['best_budget']}, {s:.2f}× AR ({where})")
    ar = next((r for r in rows if r["best_budget"] is None), None)
    base = f"AR {ar[f'{kind}_tok_s']:.1f} tokens/s {kind.upper()}" if ar else "AR not run"
    return f"At K2 depth ({base}): " + "; ".join(parts) + "."


def _short(source: str) -> str:
    return source.removeprefix("DDTree, ")


def table_rows(h: dict[str, Any]) -> list[dict[str, Any]]:
    """The headline table as CSV rows, each column named with its kind ('tokens/s (measured)')."""
    return [{(f"{head} ({kind})" if kind else head): r.get(key) for key, head, kind in h["columns"]}
            for r in h["rows"]]


def figure(h: dict[str, Any]) -> Any:
    """A matplotlib Figure (no pyplot state): tokens/s against the budget, MEASURED solid, PROJECTED
    dashed in the same colour, AR as horizontal lines, each source's best budget starred."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter
    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    ax = fig.add_subplot()
    colours: dict[str, Any] = {}
    for c in h["curves"]:
        pts = [(b, t) for b, t in zip(c["budget"], c["tok_s"], strict=True) if t is not None]
        if c["source"].startswith("AR"):
            ax.axhline(pts[0][1], color="black", lw=1.2, ls="-" if c["kind"] == "measured" else "--")
            continue
        dd = [(b, t) for b, t in pts if b]
        if not dd:
            continue
        colour = colours.setdefault(c["source"], f"C{len(colours)}")
        measured = c["kind"] == "measured"
        ax.plot(*zip(*dd, strict=True), color=colour, ls="-" if measured else "--",
                marker="o" if measured else "", ms=3, lw=1.5 if measured else 1.0,
                label=_short(c["source"]) if measured or h["status"] != "measured" else None)
    kind = "measured" if h["status"] == "measured" else "projected"
    for r in h["rows"]:
        if r["best_budget"] is not None and r["source"] in colours:
            ax.plot(r["best_budget"], r[f"{kind}_tok_s"], marker="*", ms=12, color=colours[r["source"]])
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("DDTree budget B (tree nodes)")
    ax.set_ylabel("tokens/s")
    solid = "AR; solid: MEASURED" if h["status"] == "measured" else None
    ax.plot([], [], color="black", ls="-", label=solid)
    ax.plot([], [], color="black", ls="--", label="dashed: PROJECTED")
    ax.set_title("tokens/s against the DDTree budget at K2 depth (★ best budget)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def write(out: Path, bench_dir: str | Path, shown: str | None = None) -> dict[str, Any]:
    """Build the headline from ``bench_dir``, write ``out/figures/00_headline.png`` and
    ``out/data/00_headline.csv``; the headline with ``figure`` (relative path) added. A failure to build
    it is reported in the headline (status "error"), never stops the report."""
    from ..fileio import save_figure_atomic
    from ..results import write_csv
    try:
        h = build(bench_dir, shown)
    except Exception as e:  # noqa: BLE001 - the notebooks still run; the index says why there is no answer
        return {"status": "error", "answer": f"The headline could not be built: {type(e).__name__}: {e}",
                "columns": [], "rows": [], "curves": [], "labels": []}
    if h["rows"]:
        write_csv(table_rows(h), out / "data" / f"{CSV_NAME}.csv")
        save_figure_atomic(figure(h), out / "figures" / f"{CSV_NAME}.png", dpi=100)
        h["figure"] = f"figures/{CSV_NAME}.png"
        h["csv"] = f"data/{CSV_NAME}.csv"
    return h

"""reports/index.html: the answer first (``headline``: one table and one figure, every number labelled
measured or projected with its hardware and commit), one line per notebook saying what it shows, then,
folded away, each notebook's status, duration, parameters and links and the run's provenance."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from ..fileio import write_text_atomic
from .provenance import git_text

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
.ok { background: #2a7; color: white; padding: 2px 6px; border-radius: 3px; }
.failed { background: #c33; color: white; padding: 2px 6px; border-radius: 3px; }
.pending { background: #888; color: white; padding: 2px 6px; border-radius: 3px; }
code { font-size: 85%; white-space: pre-wrap; }
h1 { margin: 0 0 0.3em 0; font-size: 1.5em; }
#answer .answer { font-size: 1.05em; margin: 0.3em 0 0.6em 0; }
#answer .body { display: flex; gap: 1.5em; align-items: flex-start; }
#answer table { margin-bottom: 0.5em; font-size: 90%; }
#answer th.measured, #answer td.measured { background: #eef6ee; }
#answer th.projected, #answer td.projected { background: #eef0f8; }
#answer th span { display: block; font-weight: normal; font-size: 85%; color: #555; }
#answer figure { margin: 0; flex: 0 0 auto; }
#answer img { width: 576px; }
#answer .labels, #answer .missing { font-size: 85%; color: #444; margin: 0.2em 0; max-width: 75em; }
#answer .missing { color: #a40; font-weight: bold; }
#notebook-lines li { margin: 0.15em 0; }
details { margin-top: 1em; }
summary { cursor: pointer; font-weight: bold; }
"""

WHAT = {
    "01_golden_bundles": "each golden bundle validated and rebuilt; FP32 against INT4 goldens",
    "02_ar_vs_ddtree": "AR and DDTree on every bundle and backend give the same tokens; accepted lengths",
    "03_fp32_vs_int4_divergence": "how far INT4 weights move the model: first divergence, KL, layer error",
    "04_kernel_throughput": "W4A16 kernels' GB/s against cuBLAS bf16 and the copy rate at K2 shapes (H200)",
    "05_ddtree_budget": "acceptance against budget and oracle p; the K2-depth stand-in measured beside "
                        "its projection, where a round's time goes; expert coverage; K2 and 8-GPU "
                        "projections",
    "06_trained_pair": "the trained code pair's real acceptance on HumanEval, DDTree against AR on the "
                       "engine, and this answer with its replayed accepted lengths",
}


def _e(x: Any) -> str:
    return html.escape(str(x))


def _link(href: str | None, text: str) -> str:
    return f'<a href="{_e(href)}">{_e(text)}</a>' if href else ""


def _row(r: dict[str, Any]) -> str:
    ok = r["status"] == "ok"
    status = _e(r["status"])
    badge = f'<span class="{"ok" if ok else "failed"}" data-status="{status}">{status}</span>'
    params = json.dumps(r["parameters"], sort_keys=True)
    links = " · ".join(x for x in (_link(r["html"], "report"), _link(r["ipynb"], "ipynb"),
                                   _link(r["log"], "log")) if x)
    return (f'<tr id="nb-{_e(r["name"])}"><td>{_link(r["html"], r["name"]) or _e(r["name"])}</td>'
            f"<td>{badge}</td><td>{r['duration_s']:.1f} s</td><td>{_e(r['reason'])}</td>"
            f"<td><code>{_e(params)}</code></td><td>{links}</td></tr>")


def _provenance(m: dict[str, Any]) -> str:
    p = m["provenance"]
    gpus = ", ".join(f"{g['name']} (driver {g['driver']}, {g['memory']})" for g in p.get("gpus", []))
    versions = ", ".join(f"{k} {v}" for k, v in p.get("versions", {}).items() if v)
    rows = [("run started", p.get("time_utc")), ("git", git_text(p.get("git", {}))), ("host", p.get("host")),
            ("CPU", f"{p.get('cpu')} x{p.get('cpu_count')}"), ("GPU", gpus or "none"),
            ("device='auto' means", "gpu" if p.get("gpus") and not p.get("cuda_simulator")
             else "cpu (reference; the numba engine runs in its CUDA simulator)"),
            ("profile", m["profile"]), ("Jupyter kernel", m["kernel"]),
            ("limits", f"{m['cell_timeout_s']:g} s per cell, {m['wall_timeout_s']:g} s per notebook"),
            ("versions", versions), ("platform", p.get("platform"))]
    return "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)


def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 100 else f"{v:.1f}"
    return _e(v)


def _headline(h: dict[str, Any] | None) -> str:
    """The answer section: one sentence, the table and the figure, the labels; or why there is none."""
    if not h:
        return ('<section id="answer"><p class="missing">No headline for this run (the runner did not '
                "build one).</p></section>")
    parts = [f'<section id="answer" data-headline="{_e(h["status"])}">',
             f'<p class="answer">{_e(h["answer"])}</p>']
    if h.get("not_measured"):
        parts.append(f'<p class="missing" id="not-measured">{_e(h["not_measured"])}</p>')
    if h.get("rows"):
        head = "".join(f'<th class="{_e(kind)}" data-col="{_e(key)}">{_e(title)}'
                       + (f"<span>{_e(kind)}</span>" if kind else "") + "</th>"
                       for key, title, kind in h["columns"])
        body = "".join("<tr>" + "".join(f'<td class="{_e(k)}" data-kind="{_e(k)}">{_cell(r.get(key))}</td>'
                                        for key, _, k in h["columns"]) + "</tr>" for r in h["rows"])
        table = f'<table id="headline"><tr>{head}</tr>{body}</table>'
        img = (f'<figure><img id="headline-figure" src="{_e(h["figure"])}" alt="tokens/s against budget">'
               "</figure>") if h.get("figure") else ""
        parts.append(f'<div class="body"><div>{table}'
                     + "".join(f'<p class="labels">{_e(t)}</p>' for t in h.get("labels", []))
                     + (f'<p class="labels">Full precision: {_link(h.get("csv"), h.get("csv", ""))}</p>'
                        if h.get("csv") else "")
                     + f"</div>{img}</div>")
    parts.append("</section>")
    return "".join(parts)


def _lines(runs: list[dict[str, Any]], pending: list[str]) -> str:
    """One line per notebook: its name (a link), its status, what it shows."""
    items = []
    for r in runs:
        ok = r["status"] == "ok"
        badge = f'<span class="{"ok" if ok else "failed"}">{_e(r["status"])}</span>'
        items.append(f"<li>{_link(r['html'], r['name']) or _e(r['name'])} {badge} "
                     f"{_e(WHAT.get(r['name'], ''))}</li>")
    items += [f'<li>{_e(n)} <span class="pending">pending</span> {_e(WHAT.get(n, ""))}</li>' for n in pending]
    return f'<ul id="notebook-lines">{"".join(items)}</ul>'


def render_index(manifest: dict[str, Any]) -> str:
    runs = manifest["notebooks"]
    failed = sum(r["status"] != "ok" for r in runs)
    pending = manifest.get("pending", [])
    summary = f"{len(runs) - failed} of {len(runs) + len(pending)} notebooks ok"
    summary += (f", {failed} failed" if failed else "") + (f", {len(pending)} not run yet" if pending else "")
    rows = "".join(_row(r) for r in runs)
    rows += "".join(f'<tr id="nb-{_e(n)}"><td>{_e(n)}</td><td><span class="pending" data-status="pending">'
                    f"pending</span></td><td></td><td></td><td></td><td></td></tr>" for n in pending)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>kdtree-workbench reports</title>
<style>{_STYLE}</style></head>
<body>
<h1>DDTree on a Kimi K2 target with INT4 experts: when does tree verification pay off?</h1>
{_headline(manifest.get("headline"))}
<h2>Notebooks</h2>
<p id="summary" data-failed="{failed}">{_e(summary)}</p>
{_lines(runs, pending)}
<details id="run-details"><summary>Parameters, durations, files and provenance of this run</summary>
<table id="notebooks"><tr><th>notebook</th><th>status</th><th>duration</th><th>reason</th>
<th>parameters</th><th>files</th></tr>{rows}</table>
<h2>Provenance</h2>
<table id="provenance">{_provenance(manifest)}</table>
</details>
</body></html>
"""


def write_index(path: Path, manifest: dict[str, Any]) -> Path:
    return write_text_atomic(path, render_index(manifest))

"""reports/index.html: one row per notebook (status, duration, parameters, links) and the provenance."""

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
"""


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
<h1>kdtree-workbench reports</h1>
<p id="summary" data-failed="{failed}">{_e(summary)}</p>
<table id="notebooks"><tr><th>notebook</th><th>status</th><th>duration</th><th>reason</th>
<th>parameters</th><th>files</th></tr>{rows}</table>
<h2>Provenance</h2>
<table id="provenance">{_provenance(manifest)}</table>
</body></html>
"""


def write_index(path: Path, manifest: dict[str, Any]) -> Path:
    return write_text_atomic(path, render_index(manifest))

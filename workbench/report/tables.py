"""Tables in notebooks: rounded HTML for reading, the CSV beside it at full precision.

Rows are a list of dicts with the same keys (long format: one row per case and implementation).
"""

from __future__ import annotations

import csv
import html
import io
import math
from pathlib import Path
from typing import Any

from ..fileio import write_text_atomic


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    return cols


def _full(v: Any) -> str:
    if hasattr(v, "item") and not isinstance(v, (list, dict)):
        v = v.item()                                     # numpy scalars (np.float64 is a float subclass)
    if isinstance(v, float):
        return repr(v)                                   # shortest exact round-trip form
    return "" if v is None else str(v)


def write_csv(rows: list[dict[str, Any]], path: str | Path) -> None:
    """Write rows as CSV with every float at full precision (repr); missing keys are empty cells."""
    buf = io.StringIO()
    cols = _columns(rows)
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow([_full(r.get(c)) for c in cols])
    write_text_atomic(path, buf.getvalue())


def fmt(v: Any, digits: int = 4) -> str:
    """A value for reading: floats to ``digits`` significant digits, lists joined, None as ''."""
    if hasattr(v, "item") and not isinstance(v, (list, dict)):
        v = v.item()
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        return f"{v:.{digits}g}"
    if isinstance(v, (list, tuple)):
        return " ".join(fmt(x, digits) for x in v)
    return str(v)


def table_html(rows: list[dict[str, Any]], digits: int = 4, caption: str = "") -> str:
    cols = _columns(rows)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(r.get(c), digits))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f'<table class="workbench-table">{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def show_table(rows: list[dict[str, Any]], name: str, out_dir: str | Path, digits: int = 4,
               caption: str = "") -> None:
    """Display ``rows`` rounded in the notebook and write ``out_dir/data/<name>.csv`` in full."""
    from IPython.display import HTML, display

    write_csv(rows, Path(out_dir) / "data" / f"{name}.csv")
    note = f"{caption} " if caption else ""
    display(HTML(table_html(rows, digits, f"{note}(full precision: data/{name}.csv)")))

"""Tables in notebooks as pandas DataFrames: rounded and styled for reading, the CSV at full precision.

A table is a DataFrame, or rows (a list of dicts, long format: one row per case and implementation)
that ``frame`` turns into one. The CSV keeps every float exactly (shortest round-trip form);
missing values and NaN are empty cells.
"""

from __future__ import annotations

import html
import numbers
import re
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from ..results import frame, write_csv

Table = pd.DataFrame | list[dict[str, Any]]


def fmt(v: Any, digits: int = 4) -> str:
    """A cell for reading: floats to ``digits`` significant digits, lists joined, missing as ''."""
    if isinstance(v, (list, tuple)):
        return " ".join(fmt(x, digits) for x in v)
    if v is None or v is pd.NA or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, numbers.Real) and not isinstance(v, numbers.Integral):
        if 10 ** digits <= abs(v) < 1e15:
            return f"{float(v):.0f}"                      # 50000 and 26469, not 5e+04 and 2.647e+04
        return f"{float(v):.{digits}g}"
    return str(v)


def styled(table: Table, digits: int = 4, caption: str = "", name: str = "", index: bool = False) -> Any:
    """The table as a pandas Styler: rounded cells, a caption, no row numbers unless ``index``."""
    df = frame(table)
    cell = partial(fmt, digits=digits)
    st = df.style.format(cell, escape="html").format_index(cell, axis=0).format_index(cell, axis=1)
    if name:
        st = st.set_uuid(re.sub(r"\W", "_", name))       # stable element ids: the same table renders the same
    if not index:
        st = st.hide(axis="index")
    st = st.set_table_attributes('class="workbench-table"')
    return st.set_caption(html.escape(caption)) if caption else st


def show_table(table: Table, name: str, out_dir: str | Path, digits: int = 4, caption: str = "",
               view: pd.DataFrame | None = None) -> None:
    """Write ``table`` to ``out_dir/data/<name>.csv`` in full and display it rounded, or display
    ``view`` instead: a compact DataFrame made from it (a pivot), shown with its index."""
    from IPython.display import HTML, display

    df = frame(table)
    write_csv(df, Path(out_dir) / "data" / f"{name}.csv")
    where = "full precision" if view is None else "full table"
    link = f'<a href="data/{name}.csv">data/{name}.csv</a>'
    note = f"{html.escape(caption)} " if caption else ""
    display(HTML(f'<p class="workbench-caption"><i>{note}({where}: {link})</i></p>'))   # as wide as the text
    display(styled(df if view is None else view, digits, name=name, index=view is not None))


def save_table(table: Table, name: str, out_dir: str | Path, what: str = "") -> None:
    """Write ``out_dir/data/<name>.csv`` and show one line pointing at it (for tables plotted instead)."""
    from IPython.display import Markdown, display

    df = frame(table)
    write_csv(df, Path(out_dir) / "data" / f"{name}.csv")
    lead = f"{what}: " if what else "The table behind the figure: "
    display(Markdown(f"*{lead}{len(df)} rows in [`data/{name}.csv`](data/{name}.csv).*"))

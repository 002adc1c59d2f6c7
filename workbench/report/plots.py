"""Figures for the notebooks: captions with hardware and date, line plots with one line per
implementation, acceptance histograms and a drawing of one DDTree round.

Each figure is shown inline (PNG) and saved as ``out_dir/figures/<name>.png``.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, MaxNLocator

from ..fileio import save_figure_atomic
from .provenance import cpu_line
from .spec import RoundTrace


def caption_text(what: str = "", hardware: str | None = None, date: str | None = None) -> str:
    """'<what> Measured on <hardware>, <date UTC>.' Defaults: this machine's CPU, which runs the numpy
    reference (results from the GPU name theirs, from their metadata), and now."""
    hw = hardware or cpu_line()
    day = date or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return f"{what} Measured on {hw}, {day}.".strip()


def finish(fig: Any, name: str, out_dir: str | Path, caption: str) -> None:
    """Put ``caption`` under the figure, save it as PNG under out_dir/figures, show it, close it.

    The caption is wrapped to the figure's width and the axes are laid out above all of its lines, so
    it never overlaps an axis label."""
    from IPython.display import display

    width_in, height_in = fig.get_size_inches()
    wrapped = textwrap.wrap(caption, max(20, int(width_in * 72 / (8 * 0.56)))) or [""]   # 8 pt characters
    bottom = (len(wrapped) * 8 * 1.25 / 72 + 0.1) / height_in                          # its lines, in inches
    fig.text(0.01, 0.005, "\n".join(wrapped), fontsize=8, ha="left", va="bottom")
    fig.tight_layout(rect=(0, min(bottom, 0.5), 1, 1))
    save_figure_atomic(fig, Path(out_dir) / "figures" / f"{name}.png", dpi=100)
    display(fig)
    plt.close(fig)


def lines(ax: Any, series: dict[str, tuple[Iterable[float], Iterable[float]]], xlabel: str, ylabel: str,
          title: str = "", logx: bool = False, logy: bool = False, marker: str = "o",
          integer_x: bool = False) -> Any:
    """One line per label: series[label] = (x, y). Axis labels should carry units. A series equal to an
    earlier one is drawn dashed with another marker and labelled "(= that one)", so no line hides another."""
    drawn: list[tuple[str, list, list]] = []
    for label, (x, y) in series.items():
        x, y = list(x), list(y)
        same = next((lb for lb, sx, sy in drawn if _equal(sx, x) and _equal(sy, y)), None)
        if same is None:
            ax.plot(x, y, marker=marker, ms=3, label=label)
        else:
            k = sum(1 for _, sx, sy in drawn if _equal(sx, x) and _equal(sy, y))
            ax.plot(x, y, marker="^v<>sD"[k % 6], ms=5, ls=("--", ":", "-.")[k % 3], lw=1.2,
                    label=f"{label} (= {same})")
        drawn.append((label, x, y))
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    if logx:
        ax.set_xscale("log", base=2)
        plain_ticks(ax.xaxis)
    if logy:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8)
    return ax


def _equal(a: list, b: list) -> bool:
    try:
        return len(a) == len(b) and bool(np.allclose(np.asarray(a, float), np.asarray(b, float),
                                                     equal_nan=True))
    except (TypeError, ValueError):
        return False


def plain_ticks(axis: Any) -> None:
    """Tick labels as plain numbers (1, 2, 4, ..., 256) rather than powers (2^0 ... 2^8) on a log axis."""
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def legend_outside(ax: Any, fontsize: float = 7) -> Any:
    """The legend to the right of the axes, where it covers no line (give the figure room for it)."""
    return ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def histogram(ax: Any, counts: np.ndarray, title: str) -> Any:
    """Bar chart of rounds per accepted length (bonus included) with the mean marked."""
    counts = np.asarray(counts)
    x = np.arange(counts.size)
    ax.bar(x, counts, color="#4477aa")
    total = counts.sum()
    if total:
        mean = float((x * counts).sum() / total)
        ax.axvline(mean, color="#cc3311", ls="--", lw=1)
        title = f"{title}\nmean {mean:.2f} tokens/round, {int(total)} rounds"
    ax.set_xlabel("accepted tokens per round")
    ax.set_ylabel("rounds")
    ax.set_title(title, fontsize=9)
    return ax


def tree_layout(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x = depth, y = leaf order from a depth-first walk) for nodes 0..N of a parent array."""
    par = np.asarray(parents)
    children: list[list[int]] = [[] for _ in par]
    for i in range(1, par.size):
        children[par[i]].append(i)
    depth = np.zeros(par.size, dtype=np.int64)
    y = np.zeros(par.size, dtype=np.float64)
    next_leaf = [0.0]

    def place(i: int) -> float:
        kids = children[i]
        for c in kids:
            depth[c] = depth[i] + 1
        y[i] = float(np.mean([place(c) for c in kids])) if kids else next_leaf[0]
        if not kids:
            next_leaf[0] += 1.0
        return y[i]

    place(0)
    return depth, y


def draw_round(ax: Any, trace: RoundTrace, title: str = "") -> Any:
    """The draft tree of one round: accepted path in green, the target's bonus token in orange."""
    tree = trace.tree
    x, y = tree_layout(tree.parents)
    on_path = set(trace.accepted)
    for i in range(1, tree.parents.size):
        p = tree.parents[i]
        hit = i in on_path and p in on_path
        ax.plot([x[p], x[i]], [y[p], y[i]], color="#228833" if hit else "#bbbbbb", lw=2.5 if hit else 0.8,
                zorder=1)
    labels = [trace.root, *tree.tokens.tolist()]
    for i in range(tree.parents.size):
        acc = i in on_path
        ax.scatter(x[i], y[i], s=160, color="#228833" if acc else "white", edgecolors="#444444", zorder=2)
        ax.text(x[i], y[i], str(labels[i]), ha="center", va="center", fontsize=6,
                color="white" if acc else "black", zorder=3)
    last = trace.accepted[-1]
    bx, by = x[last] + 1, y.min() - 1.0                       # a row of its own below the tree
    ax.plot([x[last], bx], [y[last], by], color="#ee7733", lw=2.5, ls="--", zorder=1)
    ax.scatter(bx, by, s=220, color="#ee7733", edgecolors="#444444", marker="s", zorder=2)
    ax.text(bx, by, str(trace.bonus), ha="center", va="center", fontsize=6, color="white", zorder=3)
    ax.set_xlabel("depth (tokens after the root)")
    ax.set_yticks([])
    ax.set_title(title or f"{tree.n_nodes} nodes; accepted {len(trace.accepted) - 1} + bonus "
                          f"(green path, orange square)", fontsize=9)
    return ax


def stacked(ax: Any, rows: list[dict[str, Any]], keys: Iterable[str], x: str, ylabel: str,
            title: str = "", total: str | None = None) -> Any:
    """One stacked bar per row (labelled by ``rows[i][x]``) of the ``keys`` columns; ``total`` (a column)
    marked on each bar as a black tick, e.g. a measured total beside the stacked parts."""
    pos = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for i, k in enumerate(keys):
        v = np.array([float(r.get(k) or 0.0) for r in rows])
        if v.any():
            ax.bar(pos, v, bottom=bottom, label=k, color=plt.get_cmap("tab20")(i % 20))
            bottom += v
    if total is not None:
        t = [r.get(total) for r in rows]
        ax.scatter([p for p, v in zip(pos, t, strict=True) if v is not None], [v for v in t if v is not None],
                   marker="_", s=400, color="black", zorder=3, label=total)
    ax.set_xticks(pos, [str(r[x]) for r in rows])
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    legend_outside(ax)
    return ax

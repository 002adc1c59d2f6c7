"""report.plots: a long caption clears the axis labels, equal series stay visible, log-2 axes read as
plain numbers, an outside legend covers no data."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from workbench.report import plots  # noqa: E402


def _no_overlap(a, b) -> bool:
    return a.x1 <= b.x0 or b.x1 <= a.x0 or a.y1 <= b.y0 or b.y1 <= a.y0


def test_a_long_caption_clears_the_x_label(tmp_path, monkeypatch):
    import IPython.display
    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: None)
    fig, ax = plots.plt.subplots(figsize=(6, 3.2))
    plots.lines(ax, {"a": ([1, 2, 4], [1, 2, 3])}, "budget (nodes)", "tokens/s")
    caption = "PROJECTED full-K2 tokens/s from MEASURED k2_slice layer times " * 6
    captured = {}
    monkeypatch.setattr(plots.plt, "close", lambda f: captured.setdefault("fig", f))
    plots.finish(fig, "x", tmp_path, caption)
    fig = captured["fig"]
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    cap = next(t for t in fig.texts if "PROJECTED" in t.get_text())
    assert len(cap.get_text().splitlines()) > 1                              # wrapped to the width
    assert _no_overlap(cap.get_window_extent(r), ax.xaxis.label.get_window_extent(r))
    assert _no_overlap(cap.get_window_extent(r), ax.xaxis.get_tightbbox(r))
    assert (tmp_path / "figures" / "x.png").stat().st_size > 1000


def test_equal_series_are_drawn_distinguishably_and_say_so():
    fig, ax = plots.plt.subplots()
    same = ([0.5, 0.8, 1.0], [2.0, 3.0, 4.0])
    plots.lines(ax, {"budget 16": same, "budget 32": same, "budget 64": same, "budget 4": ([0.5], [1.0])},
                "oracle p", "tau")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["budget 16", "budget 32 (= budget 16)", "budget 64 (= budget 16)", "budget 4"]
    styles = {(ln.get_linestyle(), ln.get_marker()) for ln in ax.lines[:3]}
    assert len(styles) == 3
    plots.plt.close(fig)


def test_log2_axes_read_as_plain_numbers():
    fig, ax = plots.plt.subplots()
    plots.lines(ax, {"a": ([1, 2, 4, 8, 256], [1, 2, 3, 4, 5])}, "B", "tau", logx=True)
    fig.canvas.draw()
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert "256" in ticks and "1" in ticks and not any("^" in t for t in ticks), ticks
    plots.plt.close(fig)


def test_outside_legend_covers_no_line():
    fig, ax = plots.plt.subplots(figsize=(8, 3))
    plots.lines(ax, {f"impl {i}": ([1, 2, 4], [i, i + 1, i + 2]) for i in range(6)}, "M", "GB/s")
    plots.legend_outside(ax)
    fig.tight_layout()
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    assert _no_overlap(ax.get_legend().get_window_extent(r), ax.get_window_extent(r))
    plots.plt.close(fig)

"""PNG of the kernel benchmark: matmul GB/s vs M per implementation, fused-MoE % of its floor."""

from __future__ import annotations

from pathlib import Path

from ..fileio import save_figure_atomic


def plot(rows: list[dict], path: Path, copy_gbs: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for ax, shape in zip(axes[:2], ("gate_up", "down"), strict=True):
        impls = sorted({r["impl"] for r in rows if r.get("M") and r["case"].startswith(shape)})
        for impl in impls:
            pts = sorted((r["M"], r["gbs"]) for r in rows if r["case"].startswith(shape) and r["impl"] == impl
                         and r.get("M"))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ceil = [r["gbs"] for r in rows if r["case"] == f"{shape} copy ceiling"]
        ax.axhline(copy_gbs, color="k", ls="--", lw=1, label=f"copy 2 GiB ({copy_gbs:.0f} GB/s)")
        if ceil:
            ax.axhline(ceil[0], color="gray", ls=":", lw=1,
                       label=f"copy, same bytes per launch ({ceil[0]:.0f})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (activation rows)")
        ax.set_ylabel("effective GB/s")
        ax.set_title(f"{shape} (rotating over 64 matrices, graph)")
        ax.legend(fontsize=7)
    moe = [r for r in rows if r["case"].startswith("moe") and r.get("pct_floor") is not None]
    impls = sorted({r["impl"] for r in moe})
    ts = sorted({r["T"] for r in moe})
    width = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
        vals = [next((r["pct_floor"] for r in moe if r["impl"] == impl and r["T"] == t), 0) for t in ts]
        axes[2].bar([i + j * width for i in range(len(ts))], vals, width, label=impl)
    axes[2].axhline(70, color="r", ls="--", lw=1, label="target 70%")
    axes[2].set_xticks([i + 0.4 - width / 2 for i in range(len(ts))], [f"T={t}" for t in ts])
    axes[2].set_ylabel("% of unique-expert bandwidth floor")
    axes[2].set_title("fused MoE, K2 shape (384 experts + shared, top-8)")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    try:
        save_figure_atomic(fig, path, dpi=110)
    finally:
        plt.close(fig)

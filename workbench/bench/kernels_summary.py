"""The targets table printed after ``bench kernels`` (and pasted into docs/perf.md)."""

from __future__ import annotations

from .kernels_moe import TOKENS


def _get(rows, case, prefix):
    return next((r for r in rows if r["case"] == case and r["impl"].startswith(prefix)), None)


def summary(rows: list[dict], copy_gbs: float) -> str:
    out = [f"copy bandwidth {copy_gbs:.0f} GB/s",
           "| shape | M | int4 us | GB/s | % copy | % same-size copy | x tinygemm | x cuBLAS bf16 "
           "| PDL off us |",
           "|---|---|---|---|---|---|---|---|---|"]
    for shape in ("gate_up", "down"):
        ceil = _get(rows, f"{shape} copy ceiling", "torch copy")
        for m in (1, 2, 4, 8, 16, 32, 33, 64):
            r = _get(rows, f"{shape} M={m}", "int4_matmul (")
            if r is None:
                continue
            off = _get(rows, f"{shape} M={m}", "int4_matmul, PDL off")
            off_us = f"{off['median_us']:.2f}" if off else "-"
            tg, cb = _get(rows, f"{shape} M={m}", "tinygemm"), _get(rows, f"{shape} M={m}", "cuBLAS")
            same = f"{100 * r['gbs'] / ceil['gbs']:.0f}" if ceil else "-"
            xs = [f"{o['median_us'] / r['median_us']:.2f}" if o else "-" for o in (tg, cb)]
            out.append(f"| {shape} | {m} | {r['median_us']:.2f} | {r['gbs']:.0f} | {r['pct_copy']:.0f} | "
                       f"{same} | {xs[0]} | {xs[1]} | {off_us} |")
        r1, r16 = _get(rows, f"{shape} M=1", "int4_matmul ("), _get(rows, f"{shape} M=16", "int4_matmul (")
        if r1 and r16:
            ratio = r16["median_us"] / r1["median_us"]
            out.append(f"{shape}: M=16 time / M=1 time = {ratio:.3f} (target <= 1.5)")
    wg = [(shape, m, _get(rows, f"{shape} M={m}", "int4_matmul, wgmma (exact"),
           _get(rows, f"{shape} M={m}", "int4_matmul, wgmma (f16"), _get(rows, f"{shape} M={m}", "cuBLAS"))
          for shape in ("gate_up", "down") for m in (33, 64)]
    wg = [w for w in wg if w[2] or w[3]]
    if wg:
        out += ["", "| shape | M | wgmma exact us | x cuBLAS bf16 | wgmma f16-prescaled us | x cuBLAS bf16 |",
                "|---|---|---|---|---|---|"]
        for shape, m, e, p, cb in wg:
            cells = [(f"{r['median_us']:.2f}", f"{cb['median_us'] / r['median_us']:.2f}" if cb else "-")
                     if r else ("-", "-") for r in (e, p)]
            out.append(f"| {shape} | {m} | {cells[0][0]} | {cells[0][1]} | {cells[1][0]} | {cells[1][1]} |")
    out += ["", "| MoE T | unique experts | fused us | floor us | % floor | torch loop us |",
            "|---|---|---|---|---|---|"]
    for t in TOKENS:
        r = _get(rows, f"moe T={t}", "fused_moe (")
        lp = _get(rows, f"moe T={t}", "torch per-expert")
        if r:
            out.append(f"| {t} | {r['unique_experts']:.0f} | {r['median_us']:.1f} | {r['floor_us']:.1f} | "
                       f"{r['pct_floor']:.0f} | {lp['median_us']:.0f} |" if lp else "")
    return "\n".join(out)

# %% [markdown]
# # 04 · Kernel throughput: W4A16 against cuBLAS bf16 and tinygemm
#
# Decoding a K2-sized MoE is bound by weight reads: at small M (tokens per matmul) every kernel
# should approach the HBM bandwidth, and INT4 weights move about a quarter of bf16's bytes. This
# report first states that bandwidth model for the K2 expert shapes, then shows the measured
# benchmark: effective GB/s against M for this workbench's W4A16 kernel, torch cuBLAS bf16 and
# torch tinygemm INT4, with the copy ceiling measured in the same run and the datasheet peak, and
# the fused MoE layer against its floor. The numbers come from the committed H200 results under
# `reports/bench/` unless this machine has a GPU and `rerun_on_gpu` is on, in which case the
# benchmark is run again here; each result names the GPU, date and commit it was measured at.

# %%
from pathlib import Path

from IPython.display import Markdown, display

from workbench.report import benchdata, plots, provenance, tables
from workbench.report.paths import enter_repo

enter_repo()  # relative paths below name the repository's files, wherever the kernel started

# %% tags=["parameters"]
bench_dir = "reports/bench"
rerun_on_gpu = True
shapes = [[7168, 2048], [2048, 7168]]
ms = [1, 2, 4, 8, 16, 32, 64]
group_size = 32
peak_gbps = 4800.0
peak_tflops = 989.0
out_dir = "reports/local"
profile = "full"
device = "auto"

# %%
dev = provenance.resolve_device(device)
display(Markdown(provenance.run_line(profile, device)))

# %% [markdown]
# ## The roofline model
# Least bytes a [M, K] × [K, N] matmul moves (weights once, bf16 activations in and out) and the
# time that takes at `peak_gbps`, against the time its 2·M·N·K FLOPs take at `peak_tflops` (dense
# bf16 tensor cores; H200 datasheet values). **A model, not a measurement.** Shapes are (K in, N out):
# 7168 → 2048 is an expert's gate/up projection, 2048 → 7168 its down projection; both move the
# same weight bytes, so the figure shows the first.

# %%
model_rows = []
for k, n in shapes:
    for m in ms:
        b16, b4 = benchdata.matmul_bytes(m, n, k, "bf16"), benchdata.matmul_bytes(m, n, k, "int4", group_size)
        model_rows.append({"K": k, "N": n, "M": m, "bf16_MB": b16 / 1e6, "int4_MB": b4 / 1e6,
                           "bf16_us_at_peak": b16 / peak_gbps / 1e3, "int4_us_at_peak": b4 / peak_gbps / 1e3,
                           "compute_us_at_peak": 2 * m * n * k / peak_tflops / 1e6,
                           "ideal_speedup": b16 / b4})
fig, ax = plots.plt.subplots(figsize=(7, 3.8))
rows = [r for r in model_rows if [r["K"], r["N"]] == shapes[0]]
m_axis = [r["M"] for r in rows]
plots.lines(ax, {"bf16 weights: bytes / bandwidth": (m_axis, [r["bf16_us_at_peak"] for r in rows]),
                 f"INT4 g{group_size}: bytes / bandwidth": (m_axis, [r["int4_us_at_peak"] for r in rows]),
                 "2MNK FLOPs / tensor-core peak": (m_axis, [r["compute_us_at_peak"] for r in rows])},
            "M (rows per matmul)", "lower bound on time (µs)", f"{shapes[0][0]} → {shapes[0][1]}", logx=True,
            logy=True)
plots.finish(fig, "04_roofline_model", out_dir, f"Roofline model at {peak_gbps:g} GB/s and {peak_tflops:g} "
             "TFLOP/s (H200 datasheet); computed, not measured.")
tables.save_table(model_rows, "04_bandwidth_model", out_dir,
                  "Both shapes, bytes, times at peak and the ideal INT4 speedup")

# %% [markdown]
# ## Measured: GB/s against M, and the fused MoE against its floor
# One line per implementation. For the matmuls, the dashed line is a device-to-device copy of the
# same bytes per call measured in the same run (the practical ceiling at this size), the dash-dot
# line the copy rate of a large buffer, the dotted line the datasheet peak. For the MoE layer,
# time per call against tokens, with the bandwidth floor of the distinct experts those tokens touch.

# %%
source = Path(bench_dir)
if dev == "gpu" and rerun_on_gpu:
    source = Path(out_dir) / "bench"
    ok, tail = benchdata.rerun(source)
    display(Markdown(f"Benchmark re-run on this GPU into `{source}`: {'ok' if ok else 'FAILED'}."
                     f"\n\n```\n{tail}\n```"))
results = benchdata.find_results(source)
if not results:
    display(Markdown(f"**No benchmark results in `{source}` yet.** They are written on a GPU by "
                     "`python -m workbench bench kernels --out reports/bench` and committed; this section "
                     "fills in once they are there. Nothing below is measured."))

# %%
for path, meta in results:
    rows = benchdata.read_csv(path)
    impl, case = benchdata.column(rows, "impl", "implementation"), benchdata.column(rows, "case", "shape")
    gbps, us = benchdata.column(rows, *benchdata.GBPS_NAMES), benchdata.column(rows, "median_us", "median")
    if not (rows and impl and (gbps or us)):
        display(Markdown(f"`{path.name}`: columns {list(rows[0]) if rows else []} not understood, skipped."))
        continue
    run_copy = benchdata.copy_gbps(meta, rows)
    where = (f"{meta.get('gpu', 'unknown GPU')}, {meta.get('time_utc', 'unknown date')}, "
             f"commit {meta.get('git_sha', 'unknown')}")
    display(Markdown(f"### `{path.name}`: measured on {where}"))
    groups = benchdata.families(rows, case)
    fig, axes = plots.plt.subplots(len(groups), 1, figsize=(11, 3.6 * len(groups)), squeeze=False)
    for ax, (fam, fam_rows) in zip(axes[:, 0], groups.items(), strict=True):
        tokens = benchdata.column(fam_rows, "T", "tokens")
        if tokens and any(isinstance(r.get(tokens), int) for r in fam_rows):   # a MoE layer: time per call
            lines = benchdata.series(fam_rows, tokens, us, impl)
            floor = benchdata.column(fam_rows, "floor_us")
            if floor:
                lines["bandwidth floor of the unique experts touched"] = next(iter(
                    benchdata.series(fam_rows, tokens, floor, impl).values()), ([], []))
            plots.lines(ax, lines, f"{tokens} (tokens per call)", "median time per call (µs)", fam, logx=True,
                        logy=True)
            plots.legend_outside(ax)
            continue
        x = benchdata.column(fam_rows, "M", "m")
        body = [r for r in fam_rows if not benchdata.is_ceiling(r, case)] if case else fam_rows
        plots.lines(ax, benchdata.series(body, x, gbps, impl), f"{x} (rows per call)",
                    "effective bandwidth (GB/s)", fam, logx=True)
        for r in fam_rows:
            if case and benchdata.is_ceiling(r, case):
                ax.axhline(r[gbps], color="black", ls="--", lw=0.8,
                           label=f"copy, same bytes {r[gbps]:.0f} GB/s")
        if run_copy:
            ax.axhline(run_copy, color="gray", ls="-.", lw=0.8, label=f"copy, big buffer {run_copy:.0f} GB/s")
        ax.axhline(peak_gbps, color="gray", ls=":", lw=0.8, label=f"datasheet peak {peak_gbps:.0f} GB/s")
        plots.legend_outside(ax)
    plots.finish(fig, "04_kernels", out_dir, plots.caption_text(
        f"{path.name}, commit {meta.get('git_sha', 'unknown')}.",
        hardware=str(meta.get("gpu", "unknown GPU")), date=str(meta.get("time_utc", "unknown date"))))
    tables.save_table(rows, "04_kernels", out_dir, f"Every measurement of `{path.name}` ({where})")

# %% [markdown]
# ## The whole decode step
# These kernels assembled into the engine's decode step, its AR tokens/s against HF transformers and
# its per-token time against the sum of its kernels' times, are shown in `05_ddtree_budget`, where
# that step is the baseline of the verify cost and of DDTree's speedup.

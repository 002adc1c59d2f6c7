# %% [markdown]
# # 01 · Golden bundles
#
# The golden bundles in `refs/` are the fixed points every implementation is checked against: a
# seeded random model of the Kimi-K2 architecture at a tiny size, a prompt, and the reference's
# greedy tokens with their top-1 minus top-2 logit margins. This report checks that each bundle
# still reads (all CRCs), that the numpy reference reproduces its golden tokens, and that
# `workbench.refs` rebuilds it on this machine's CPU; then it shows what is inside, and how the INT4
# twin of each model departs from the FP32 golden.

# %%
from IPython.display import Markdown, display

from workbench.report import bundles, plots, provenance, tables
from workbench.report.paths import enter_repo
from workbench.report.progress import progress

enter_repo()  # relative paths below name the repository's files, wherever the kernel started

# %% tags=["parameters"]
bundle_names = ["tiny", "tiny2", "int4_tiny", "int4_tiny2"]
int4_pairs = {"int4_tiny": "tiny", "int4_tiny2": "tiny2"}
refs_dir = "refs"
rebuild = True
out_dir = "reports/local"
profile = "full"
device = "auto"

# %%
display(Markdown(provenance.run_line(profile, device)))
refs = bundles.load(refs_dir, bundle_names)

# %% [markdown]
# ## Validation
# `golden_reproduced`: greedy decoding of the bundle's own weights with the float32 reference gives
# the stored tokens. `max_margin_diff` is the largest difference to the stored margins (logits),
# `fp32_noise` the float32-vs-float64 logit difference recorded when the bundle was built; every
# margin should sit far above it. With `rebuild`, `workbench.refs` rebuilds the bundle from its seeds
# in a temporary folder: tensors, tokens and config must come out identical and the margins within
# `refs.MARGIN_TOL` (`identical_file` says whether the bytes match too; the float32 noise figure may
# differ in its second digit on another CPU).

# %%
checks = [bundles.validate(n, b) for n, b in progress(refs.items(), "validate", len(refs))]
tables.show_table(checks, "01_validation", out_dir)
if rebuild:
    rebuilt = [bundles.rebuild(n, b) for n, b in progress(refs.items(), "rebuild", len(refs))]
    tables.show_table(rebuilt, "01_rebuild", out_dir)

# %% [markdown]
# ## Configurations

# %%
tables.show_table(bundles.config_rows(refs), "01_configs", out_dir)

# %% [markdown]
# ## Tensor tables
# Tensors grouped by family: how many, and their bytes in MB, per bundle. In the INT4 bundles each
# quantized linear `X` is stored as `X.packed` (int32) plus `X.scale` (float16), so its count
# doubles and its bytes shrink. Element counts and dtypes are in the CSV.

# %%
tensors = tables.frame([r for n, b in refs.items() for r in bundles.tensor_rows(n, b)])
by_family = tensors.assign(MB=tensors["bytes"] / 1e6).pivot(index="family", columns="bundle",
                                                            values=["tensors", "MB"])
tables.show_table(tensors, "01_tensors", out_dir, view=by_family[[(v, n) for v in ("tensors", "MB")
                                                                  for n in refs]])

# %% [markdown]
# ## Golden tokens and margins
# The margin of step *i* is how far the chosen token's logit sits above the runner-up: the room an
# implementation has for rounding differences before it would pick another token.

# %%
fig, ax = plots.plt.subplots(figsize=(7, 3.5))
plots.lines(ax, {n: (range(len(b.margins)), b.margins) for n, b in refs.items()},
            "golden step", "top-1 minus top-2 logit (logit units)", "golden margins per step", logy=True)
plots.finish(fig, "01_margins", out_dir, plots.caption_text("float32 numpy reference."))
tables.show_table([{"bundle": n, "prompt": b.prompt.tolist(), "golden": b.golden.tolist()}
                   for n, b in refs.items()], "01_golden_tokens", out_dir)

# %% [markdown]
# ## FP32 vs INT4 goldens, side by side
# The INT4 bundle holds the same model with every MLP linear quantized (group size in its meta);
# its golden is the reference's greedy decoding of the quantized weights. Where the two part ways
# is set by how the INT4 logit error compares with the margins above; report 03 measures that error.
# Each figure shows both goldens' margins per step, with the steps whose tokens differ shaded; the
# tokens are in the table above and, step by step, in the CSV.

# %%
for q, f in int4_pairs.items():
    if q not in refs or f not in refs:
        display(Markdown(f"*{q} / {f}: not both in `bundle_names`, skipped.*"))
        continue
    rows, first = bundles.golden_side_by_side(refs[f], refs[q])
    where = "identical over all steps" if first is None else f"first divergence at step {first}"
    display(Markdown(f"**{f} vs {q}** ({bundles.quant_text(refs[q].meta)}): {where}."))
    side = tables.frame(rows)
    fig, ax = plots.plt.subplots(figsize=(7, 3.2))
    plots.lines(ax, {f"{f} (FP32)": (side["step"], side["fp32_margin"]),
                     f"{q} (INT4)": (side["step"], side["int4_margin"])},
                "golden step", "top-1 minus top-2 logit (logit units)", f"{f} vs {q}: {where}", logy=True)
    for s in side.loc[~side["same"], "step"]:
        ax.axvspan(s - 0.5, s + 0.5, color="#cc3311", alpha=0.12, lw=0)
    plots.finish(fig, f"01_side_by_side_{f}", out_dir, plots.caption_text(
        "Shaded: steps whose golden tokens differ. float32 numpy reference."))
    tables.save_table(side, f"01_side_by_side_{f}", out_dir, "Tokens and margins step by step")

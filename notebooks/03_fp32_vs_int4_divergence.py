# %% [markdown]
# # 03 · FP32 vs INT4: where and how much the outputs diverge
#
# The same model twice: FP32 weights, and the MLP linears quantized to INT4 (W4A16, symmetric
# per-group scales, policy `mlp`). First the free-running view (greedy decoding of both, and the
# first step where they disagree), then the teacher-forced view: both models read the same
# FP32-generated text, and at every position we compare their next-token distributions: KL
# divergence, top-1 agreement and logit error. Per-layer hidden-state error shows where the error
# enters, per-matrix statistics what the quantizer does to each weight, and group sizes 32, 64
# and 128 trade bytes for accuracy.
#
# Models are golden bundles (`{"bundle": ...}`) or seeded random models of a preset
# (`{"preset": ..., "overrides": ...}`); the tiny bundles have expert widths below 128, so a
# preset variant with wider experts carries the full group-size sweep.

# %%
import numpy as np
from IPython.display import Markdown, display

from workbench.quant.policy import quantize_weights
from workbench.reference.generate import greedy_generate
from workbench.report import analysis, bundles, plots, provenance, tables
from workbench.report.paths import enter_repo
from workbench.report.progress import progress

enter_repo()  # relative paths below name the repository's files, wherever the kernel started

# %% tags=["parameters"]
models = [{"bundle": "tiny"}, {"bundle": "tiny2"},
          {"preset": "tiny", "overrides": {"moe_intermediate_size": 128}, "seed": 11, "name": "tiny_moe128"}]
n_free = 64
n_forced = 384
group_sizes = [32, 64, 128]
policy = "mlp"
refs_dir = "refs"
out_dir = "reports/local"
profile = "full"
device = "auto"

# %%
display(Markdown(provenance.run_line(profile, device)))
specs = {}     # name -> (config, prompt)
weights = {}   # (name, G or None) -> weights; None is FP32
skipped = []
for spec in models:
    name, cfg, w, prompt = bundles.load_model(spec, refs_dir)
    specs[name], weights[name, None] = (cfg, prompt), w
    for g in group_sizes:
        if analysis.group_size_fits(cfg, w, policy, g):
            weights[name, g] = quantize_weights(cfg, w, policy=policy, group_size=g)[0]
        else:
            skipped.append(f"{name} at G={g}")
pairs = [(n, g) for (n, g) in weights if g is not None]
if skipped:
    display(Markdown("**Not every group size fits every model** (an input dim is not a multiple of G): "
                     + ", ".join(skipped) + " left out."))

# %% [markdown]
# ## Free-running: the first divergence
# Greedy decoding of `n_free` tokens after the prompt, FP32 against INT4 at each group size.

# %%
free = {}
for key in progress(list(weights), "free-running"):
    cfg, prompt = specs[key[0]]
    free[key] = greedy_generate(cfg, weights[key], prompt, n_free).tokens
rows = [{"model": n, "group_size": g, "tokens": n_free,
         "first_divergence": analysis.first_divergence(free[n, None], free[n, g]),
         "same_tokens_fraction": float(np.mean(free[n, None] == free[n, g]))} for n, g in pairs]
tables.show_table(rows, "03_free_running", out_dir, caption="first_divergence empty = identical throughout.")

# %% [markdown]
# ## Teacher-forced comparison over long sequences
# The forced text is the FP32 model's own greedy continuation (`n_forced` tokens). Row *t* is the
# next-token distribution after prompt + the first *t* forced tokens; KL is KL(FP32 ‖ INT4) in nats.
# As a check, the FP32 teacher-forced argmax should reproduce the forced tokens (one batched
# forward against token-by-token decoding; a flip would need a margin below the float32 noise).

# %%
forced, tf, cmp, summary = {}, {}, {}, []
for key in progress(list(weights), "teacher-forced"):
    name, g = key
    cfg, prompt = specs[name]
    if g is None:
        forced[name] = greedy_generate(cfg, weights[key], prompt, n_forced)
    tf[key] = analysis.teacher_forced(cfg, weights[key], prompt, forced[name].tokens,
                                      capture=tuple(range(cfg.num_hidden_layers)))
for name, g in pairs:
    cmp[name, g] = analysis.compare_logits(tf[name, None].logits, tf[name, g].logits)
    summary.append({"model": name, "group_size": g, **analysis.forced_summary(
        tf[name, None], tf[name, g], forced[name].tokens, forced[name].margins)})
tables.show_table(summary, "03_teacher_forced_summary", out_dir)

# %%
for name in specs:
    gs = [g for n, g in pairs if n == name]
    fig, axes = plots.plt.subplots(1, 2, figsize=(11, 3.6))
    plots.lines(axes[0], {f"G={g}": (range(n_forced), cmp[name, g]["kl"]) for g in gs},
                "position in the forced text (tokens)", "KL(FP32 || INT4) (nats)",
                f"{name}: per-position KL", logy=True, marker="")
    err = {f"INT4 G={g} max |logit error|": (range(n_forced), cmp[name, g]["max_abs_logit_err"]) for g in gs}
    err["FP32 margin (top-1 minus top-2)"] = (range(n_forced), forced[name].margins)
    plots.lines(axes[1], err, "position in the forced text (tokens)", "logit units",
                f"{name}: logit error vs the FP32 margin", logy=True, marker="")
    plots.finish(fig, f"03_teacher_forced_{name}", out_dir,
                 plots.caption_text(f"{name}, policy {policy}, float32 numpy reference."))

# %% [markdown]
# ## Where the error enters: hidden states per layer
# Relative error ‖h_INT4 − h_FP32‖ / ‖h_FP32‖ of each block's output, averaged over the forced
# positions. Dense layers come first (`first_k_dense_replace`), then MoE layers.

# %%
layer_rows = [{"model": n, "group_size": g, **r} for n, g in pairs
              for r in analysis.hidden_errors(tf[n, None].hidden, tf[n, g].hidden)]
fig, axes = plots.plt.subplots(1, len(specs), figsize=(4.5 * len(specs), 3.6), squeeze=False)
for ax, name in zip(axes[0], specs, strict=True):
    mine = [r for r in layer_rows if r["model"] == name]
    series = {f"G={g}": ([r["layer"] for r in mine if r["group_size"] == g],
                         [r["mean_rel_err"] for r in mine if r["group_size"] == g])
              for n, g in pairs if n == name}
    plots.lines(ax, series, "layer (block output)", "mean relative error (fraction)", name, logy=True,
                integer_x=True)
plots.finish(fig, "03_hidden_state_error", out_dir, plots.caption_text("Teacher-forced, float32 reference."))
tables.save_table(layer_rows, "03_hidden_state_error", out_dir, "Per layer, mean and max relative error")

# %% [markdown]
# ## What the quantizer does to each matrix
# quantize → dequantize of every matrix the policy selects: relative Frobenius error, and the
# largest element error as a fraction of the matrix's largest |w|. The table shows the mean
# relative Frobenius error per kind of matrix and group size; its CSV adds the max and the count.

# %%
qrows = tables.frame([{"model": n, **r} for n in specs
                      for r in analysis.quantization_errors(specs[n][0], weights[n, None],
                                                            tuple(g for m, g in pairs if m == n), policy)])
tables.save_table(qrows, "03_matrix_errors", out_dir, "Every matrix at every group size")
per_kind = (qrows.groupby(["model", "kind", "group_size"], sort=False)["rel_frobenius_err"]
            .agg(mean_rel_frobenius_err="mean", max_rel_frobenius_err="max", count="count").reset_index())
tables.show_table(per_kind, "03_matrix_error_summary", out_dir, caption="Mean relative Frobenius error.",
                  view=per_kind.pivot(index=["model", "kind"], columns="group_size",
                                      values="mean_rel_frobenius_err"))

# %% [markdown]
# ## Group size 32 vs 64 vs 128
# Bytes per weight are 0.5 for the codes plus one float16 scale per group. Each row averages over
# the models that group size fits.

# %%
by_g = tables.frame(summary).groupby("group_size").agg(models=("model", "nunique"),
                                                       mean_kl_nats=("mean_kl_nats", "mean"),
                                                       top1_agreement=("top1_agreement", "mean"))
by_g = by_g.assign(bytes_per_weight=0.5 + 2 / by_g.index,
                   mean_rel_weight_err=qrows.groupby("group_size")["rel_frobenius_err"].mean())
tables.show_table(by_g.reset_index()[["group_size", "models", "bytes_per_weight", "mean_rel_weight_err",
                                      "mean_kl_nats", "top1_agreement"]], "03_group_sizes", out_dir)

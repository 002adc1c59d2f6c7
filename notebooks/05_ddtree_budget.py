# %% [markdown]
# # 05 · DDTree budget: acceptance, verify cost, speedup and MoE expert coverage
#
# A larger draft tree accepts more tokens per round, but the verify forward grows with it. On a
# memory-bound MoE target the growth is mostly **which experts the tree's tokens touch**: every
# distinct routed expert is one more weight read. This report measures acceptance against the
# budget and the oracle's accuracy p on the numpy reference, measures the expert coverage of real
# draft trees routed through a K2-sized router (E = 384, top-8), compares it with the analytic
# curve E·(1 − (1 − k/E)^N) for N independent tokens, and combines both into a bandwidth-model
# estimate of the speedup at K2 scale.

# %%
import numpy as np
from IPython.display import Markdown, display

from workbench.config import preset
from workbench.ddtree import DrafterConfig, ddtree_generate
from workbench.report import bundles, plots, provenance, spec, tables
from workbench.report.progress import progress

# %% tags=["parameters"]
bundle_name = "tiny"
budgets = [1, 2, 4, 8, 16, 32, 64]
oracle_ps = [0.5, 0.7, 0.8, 0.9, 1.0]
n_tokens = 32
coverage_drafter = "dflash"
coverage_budget = 1024
coverage_trees = 4
coverage_preset = "k2"
router_seed = 0
group_size = 32
refs_dir = "refs"
out_dir = "reports"
profile = "full"
device = "auto"

# %%
display(Markdown(provenance.run_line(profile, device)))
b = bundles.load(refs_dir, [bundle_name])[bundle_name]
cfg, weights, prompt = b.config, b.weights(), b.prompt
dcfg = DrafterConfig.from_dict(b.meta["drafter"])

# %% [markdown]
# ## Acceptance against budget and oracle p
# Mean tokens per round τ (bonus included) of greedy DDTree with the oracle drafter at each p, and
# with the bundle's random-weight `dflash` drafter for reference. Reference backend.

# %%
grid = [(p, bud) for p in oracle_ps for bud in budgets]
acc_rows = []
for p, bud in progress(grid, "oracle sweep"):
    r = ddtree_generate(cfg, weights, prompt, n_tokens, drafter="oracle", budget=bud, drafter_config=dcfg,
                        oracle_p=p)
    acc_rows.append({"drafter": f"oracle p={p}", "oracle_p": p, "budget": bud, "tau": r.mean_accepted,
                     "rounds": len(r.rounds)})
for bud in progress(budgets, "dflash"):
    r = ddtree_generate(cfg, weights, prompt, n_tokens, drafter="dflash", budget=bud, drafter_config=dcfg)
    acc_rows.append({"drafter": "dflash (random weights)", "oracle_p": None, "budget": bud,
                     "tau": r.mean_accepted, "rounds": len(r.rounds)})
tables.show_table(acc_rows, "05_acceptance", out_dir)
fig, axes = plots.plt.subplots(1, 2, figsize=(11, 3.8))
labels = list(dict.fromkeys(r["drafter"] for r in acc_rows))
plots.lines(axes[0], {d: ([r["budget"] for r in acc_rows if r["drafter"] == d],
                          [r["tau"] for r in acc_rows if r["drafter"] == d]) for d in labels},
            "tree budget (nodes)", "τ, tokens per round", "acceptance vs budget", logx=True)
plots.lines(axes[1], {f"budget {bud}": (oracle_ps, [r["tau"] for r in acc_rows
                                                  if r["budget"] == bud and r["oracle_p"] is not None])
                      for bud in budgets}, "oracle p (top-1 accuracy per position)", "τ, tokens per round",
            "acceptance vs oracle p")
plots.finish(fig, "05_acceptance", out_dir, plots.caption_text(
    f"{bundle_name}, {n_tokens} tokens, block size {dcfg.block_size}, numpy reference."))

# %% [markdown]
# ## MoE expert coverage of real draft trees at K2 scale
# Trees come from `coverage_trees` consecutive rounds of greedy DDTree on the bundle with the
# `coverage_drafter` at budget `coverage_budget`. The heap pops nodes best-first, so the first N
# nodes of a tree are exactly the tree at budget N. Root + nodes are embedded with a fixed random
# K2-width row per token id (RMS-normalised) and routed by the reference router (`moe_gate`) of a
# K2-sized config with **random router weights**: coverage then reflects how many *distinct*
# tokens a tree holds (siblings repeat tokens across depths), not trained routing. The analytic
# curve assumes every row picks k of E experts independently and uniformly.

# %%
k2 = preset(coverage_preset)
gate, bias = spec.random_router(k2, router_seed)
sizes = [n for n in (2 ** np.arange(0, 16)).tolist() if n <= coverage_budget + 1]
curves = []
for r in progress(range(coverage_trees), "trees"):
    t = spec.capture_round(cfg, weights, prompt, n_tokens, r, drafter=coverage_drafter,
                           budget=coverage_budget, drafter_config=dcfg, oracle_p=0.8)
    rows_tokens = np.concatenate([[t.root], t.tree.tokens])
    idx = spec.route_tokens(k2, rows_tokens, gate, bias, router_seed)
    curves.append(spec.coverage_curve(idx, [min(n, len(rows_tokens)) for n in sizes]))
measured = np.mean(curves, axis=0)
analytic = spec.analytic_coverage(k2.n_routed_experts, k2.num_experts_per_tok, sizes)
cov_rows = [{"rows": n, "measured_unique_experts": float(m), "analytic_unique_experts": float(a)}
            for n, m, a in zip(sizes, measured, analytic, strict=True)]
tables.show_table(cov_rows, "05_expert_coverage", out_dir, caption=f"mean over {coverage_trees} trees.")
fig, ax = plots.plt.subplots(figsize=(7, 4))
plots.lines(ax, {"measured (tree tokens, reference router)": (sizes, measured),
                 "analytic E(1-(1-k/E)^N)": (sizes, analytic)},
            "verify rows N (root + tree nodes)", "distinct routed experts touched per MoE layer",
            f"expert coverage, E={k2.n_routed_experts}, top-{k2.num_experts_per_tok}", logx=True)
ax.axhline(k2.n_routed_experts, color="gray", lw=0.8, ls=":")
plots.finish(fig, "05_expert_coverage", out_dir, plots.caption_text(
    f"{coverage_drafter} trees from {bundle_name}, random K2 router (seed {router_seed})."))

# %% [markdown]
# ## Verify cost and speedup at K2 scale (bandwidth model)
# **A model, not a measurement:** one forward reads MLA, router and head in bf16 and the MLPs and
# the touched experts in INT4 (group size `group_size`), and takes time proportional to those
# bytes. KV-cache reads, activations, the drafter's own cost and compute limits are left out, so
# this is an upper bound on the speedup: τ(B) × bytes(1 row) / bytes(B + 1 rows), with the
# experts touched at B + 1 rows taken from the measured coverage above.

# %%
one = spec.forward_weight_bytes(k2, k2.num_experts_per_tok, group_size)   # one row touches exactly k experts
cost_rows = []
for row in acc_rows:
    n_rows = row["budget"] + 1
    touched = float(np.interp(n_rows, sizes, measured))
    bytes_b = spec.forward_weight_bytes(k2, touched, group_size)
    cost_rows.append({**row, "verify_rows": n_rows, "experts_touched": touched, "verify_GB": bytes_b / 1e9,
                      "cost_vs_decode": bytes_b / one, "model_speedup": row["tau"] * one / bytes_b})
tables.show_table(cost_rows, "05_speedup_model", out_dir)
fig, axes = plots.plt.subplots(1, 2, figsize=(11, 3.8))
plots.lines(axes[0], {"verify": (budgets, [r["cost_vs_decode"] for r in cost_rows
                                          if r["drafter"] == labels[0]])},
            "tree budget (nodes)", "weight bytes vs one decode row (x)", "verify cost (model)", logx=True)
plots.lines(axes[1], {d: (budgets, [r["model_speedup"] for r in cost_rows if r["drafter"] == d])
                      for d in labels},
            "tree budget (nodes)", "speedup over AR (x, model)", "speedup (bandwidth model)", logx=True)
axes[1].axhline(1.0, color="gray", lw=0.8, ls=":")
plots.finish(fig, "05_speedup_model", out_dir, plots.caption_text(
    f"K2 ({coverage_preset}) bytes model, INT4 G={group_size}; τ measured on {bundle_name}."))

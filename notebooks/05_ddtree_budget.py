# %% [markdown]
# # 05 · DDTree budget: acceptance, verify cost, speedup and MoE expert coverage
#
# It opens with the answer at K2 depth: a 61-layer stand-in at K2.6's dimensions (random weights)
# run end to end on one GPU by `bench depth`, its measured ms per token beside its projection for each
# budget and acceptance source, and where a round's time goes.
#
# A larger draft tree accepts more tokens per round, but the verify forward grows with it. On a
# memory-bound MoE target the growth is mostly **which experts the tree's tokens touch**: every
# distinct routed expert is one more weight read. This report measures acceptance against the
# budget and the oracle's accuracy p on the numpy reference, measures the expert coverage of real
# draft trees routed through a K2-sized router (E = 384, top-8), compares it with the analytic
# curve E·(1 − (1 − k/E)^N) for N independent tokens, and combines both into a bandwidth-model
# estimate of the speedup at K2 scale.
#
# Next to these it shows the **measured** numbers of this workbench's numba engine on a GPU
# (`python -m workbench bench engine`): the AR baseline against HF transformers, the decode step
# against the sum of its kernels, the verify step against the budget, and DDTree tokens/s against
# AR over oracle p and budget, with the engine's acceptance checked against the reference's. They
# come from the committed H200 results in `reports/bench/` unless this machine has a GPU and
# `rerun_engine_on_gpu` is on, in which case the benchmark runs again here. Every section says
# whether its numbers are **measured** or a **model**, and where they were measured.

# %%
import numpy as np
from IPython.display import Markdown, display

from workbench import k2proj
from workbench.config import preset
from workbench.ddtree import DrafterConfig, ddtree_generate
from workbench.report import (
    benchdata,
    bundles,
    depthdata,
    enginedata,
    plots,
    provenance,
    spec,
    tables,
)
from workbench.report.paths import enter_repo
from workbench.report.progress import progress

enter_repo()  # relative paths below name the repository's files, wherever the kernel started

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
engine_bench_dir = "reports/bench"
depth_bench_dir = "reports/bench"
rerun_engine_on_gpu = True
engine_ref_budgets = None
engine_ref_ps = None
engine_oracle_seed = 1
refs_dir = "refs"
out_dir = "reports/local"
profile = "full"
device = "auto"

# %%
dev = provenance.resolve_device(device)
display(Markdown(provenance.run_line(profile, device)))
b = bundles.load(refs_dir, [bundle_name])[bundle_name]
cfg, weights, prompt = b.config, b.weights(), b.prompt
dcfg = DrafterConfig.from_dict(b.meta["drafter"])

# %% [markdown]
# ## At K2 depth: the stand-in measured, its projection beside it (`bench depth`)
# `python -m workbench bench depth` runs Kimi-K2.6's 61 layers (1 dense + 60 MoE, 384 INT4 experts,
# the rest bf16) end to end on the engine on one GPU, with **random weights, not K2's**: 595 GB of INT4
# do not fit one H200, so the 60 MoE layers cycle over as many distinct weight sets as fit (each far
# larger than the L2, so every layer reads its weights from HBM). **Measured**: ms per generated token
# of AR and of DDTree at each budget, with the oracle drafter at each p and with the trained code
# pair's accepted lengths replayed on the measured round times. **Projected**: the same run's parts
# (each timed alone as a CUDA graph) composed into a round, as the full-K2 projections below compose
# theirs; the ratio says how much of a real round the parts miss (synchronisations, copies back, graph
# launches). Then where a round's time goes, part by part.

# %%
depth = depthdata.load_depth(depth_bench_dir)
if depth is None or depth.dry_run:
    why = "only a dry run (CUDA simulator, no timing)" if depth is not None else "none"
    display(Markdown(f"**Not measured yet**: the `bench depth` result set in `{depth_bench_dir}` is {why}. "
                     "`python -m workbench bench depth` writes it on a GPU; this section stays empty until "
                     "then (the projections further down do not need it)."))
else:
    display(Markdown(f"**{depth.label}** (`{depth.path.name}`): the {depth.stand_in}. Its tokens mean "
                     "nothing; its routing is near uniform, the worst case for a tree's distinct experts."))
    sbs = tables.frame(depthdata.side_by_side(depth))
    view = sbs.pivot(index="budget", columns="source",
                     values=["measured_ms_per_token", "projected_ms_per_token", "measured_over_projected"])
    view.columns = [f"{src}: {what.replace('_', ' ')}" for what, src in view.columns]
    tables.show_table(sbs, "05_depth_side_by_side", out_dir, digits=3, view=view, caption=(
        f"ms per generated token by budget (0 = AR): MEASURED ({depth.hardware}, commit {depth.commit}, "
        f"{depth.date}) beside PROJECTED from the same run's measured parts; the pair's rows are its "
        "accepted lengths replayed on the measured round times."))
    split = depthdata.split(depth)
    tables.show_table(split, "05_depth_split", out_dir, digits=3, caption=(
        f"A round's time by part, ms per round (budget 0 = an AR step), from parts MEASURED on "
        f"{depth.hardware}, commit {depth.commit}; MoE parts are one layer's times 60; host phases are the "
        "oracle runs' mean. projected_round_ms is their sum, measured_round_ms the measured round."))
    fig, ax = plots.plt.subplots(figsize=(10, 4.2))
    plots.stacked(ax, split, depthdata.SPLIT_PARTS, "budget", "ms per round",
                  "where a round's time goes at K2 depth (parts MEASURED, summed)", total="measured_round_ms")
    ax.set_xlabel("DDTree budget B (0 = AR step)")
    plots.finish(fig, "05_depth_split", out_dir, plots.caption_text(
        f"{depth.stand_in}; black tick: the measured round.", hardware=depth.hardware,
        date=f"{depth.date}, commit {depth.commit}"))
    auto = depthdata.cost_aware(depth)
    if auto:
        tables.show_table(tables.frame(auto), "05_depth_cost_aware", out_dir, digits=3, caption=(
            f"The cost-aware budget, MEASURED ({depth.hardware}, commit {depth.commit}): ms per token beside "
            "its source's best fixed budget (vs_best_fixed > 1: faster), the nodes it verified a round, its "
            "tau beside the E(N) the draft stated and the oracle's hit rate as drawn (empty: not recorded "
            "by this set)."))

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
acc = tables.frame(acc_rows)
tau_table = acc.pivot(index="drafter", columns="budget", values="tau").loc[acc["drafter"].unique()]
tables.show_table(acc, "05_acceptance", out_dir, caption="τ, tokens per round, by drafter and budget.",
                  view=tau_table)
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
# ## Measured on the GPU: the engine benchmark
# Results of `python -m workbench bench engine` (numba engine, CUDA-graph replay, greedy) on the
# `tiny2` bundles. On a machine with a GPU (and `rerun_engine_on_gpu`) the benchmark runs again here
# into `<out_dir>/bench`; otherwise the committed results in `engine_bench_dir` are shown, with
# their GPU and date.

# %%
engine_source = engine_bench_dir
if dev == "gpu" and rerun_engine_on_gpu:
    engine_source = f"{out_dir}/bench"
    ok, tail = benchdata.rerun(engine_source, what="engine")
    display(Markdown(f"Engine benchmark re-run on this GPU into `{engine_source}`: "
                     f"{'ok' if ok else 'FAILED; the committed results are shown instead'}."
                     f"\n\n```\n{tail}\n```"))
    engine_source = engine_source if ok else engine_bench_dir
eng = enginedata.load_engine(engine_source)
if eng is None:
    display(Markdown(f"**No engine benchmark results in `{engine_source}`.** They are written on a GPU by "
                     "`python -m workbench bench engine --out reports/bench` and committed; the measured "
                     "sections below stay empty until then."))
else:
    display(Markdown(f"**Measured** on **{eng.hardware}**, {eng.date} (`{eng.path}`; numba "
                     f"{eng.meta.get('numba_cuda', '?')} / torch {eng.meta.get('torch', '?')})."))

# %% [markdown]
# ### The AR baseline: engine vs HF transformers, and where the decode step goes (measured)
# Tokens/s of greedy AR decoding on the same GPU: this engine against transformers'
# `DeepseekV3ForCausalLM.generate` (float32, eager attention) on the same weights. Then the
# engine's per-token time (graph replay) against the sum of its kernels' own device times
# (profiler over eager decode steps), and that sum kernel by kernel.

# %%
if eng is not None:
    tables.show_table(enginedata.ar_table(eng), "05_engine_ar", out_dir,
                      caption=f"Measured on {eng.hardware}, {eng.date}.")
    tables.show_table(enginedata.kernel_sum_table(eng), "05_engine_kernel_sum", out_dir,
                      caption=f"Measured on {eng.hardware}, {eng.date}; µs per token.")
    for m in eng.models("kernel_breakdown"):
        tables.show_table(enginedata.kernel_breakdown(eng, m), f"05_engine_kernels_{m}", out_dir,
                          caption=f"{m}: kernel time per decoded token, measured on {eng.hardware}, "
                                  f"{eng.date}.")

# %% [markdown]
# ### Verify cost against the budget (measured)
# Time of one verify forward (B + 1 rows, graph replay) against the budget B, next to the device
# top-k of the draft rows and the host build of the tree; the dotted line is the engine's measured
# AR decode time per token.

# %%
if eng is not None:
    for m in eng.models("verify"):
        ver = enginedata.verify_table(eng, m)
        pos = [r for r in ver if r["budget"] >= 1]
        bx = [r["budget"] for r in pos]
        fig, ax = plots.plt.subplots(figsize=(7.5, 4))
        plots.lines(ax, {"verify step (B + 1 rows)": (bx, [r["verify_us"] for r in pos]),
                         "device top-k + host tree build": (bx, [r["topk_us"] + r["build_us"] for r in pos])},
                    "tree budget B (nodes)", "time per round (µs)", f"{m}: verify cost vs budget (measured)",
                    logx=True, logy=True)
        ar_us = enginedata.ar_us_per_token(eng, m)
        if ar_us is not None:
            ax.axhline(ar_us, color="gray", ls=":", lw=1, label=f"AR decode, {ar_us:.0f} µs/token")
            ax.legend(fontsize=8)
        plots.finish(fig, f"05_engine_verify_{m}", out_dir, plots.caption_text(
            f"{m}, numba engine, CUDA-graph replay.", hardware=eng.hardware, date=eng.date))
        tables.save_table(ver, f"05_engine_verify_{m}", out_dir,
                          f"{m}, measured on {eng.hardware} (budget 0 = the 1-row decode step)")

# %% [markdown]
# ### DDTree against AR over oracle p and budget (measured), with the reference's τ
# Tokens/s of greedy DDTree with the oracle drafter (seed `engine_oracle_seed`) on the engine,
# against the engine's AR in the same run; measured speedup = their ratio. τ (tokens per round,
# bonus included) is reported by the engine and recomputed here by the numpy reference for the same
# model, tokens and oracle (the reference column is empty where this profile skips that run).
# `speedup_ref_tau` = τ_ref × AR µs/token ÷ µs per round: the speedup the reference's
# acceptance gives at the engine's measured costs.

# %%
spec_rows = []
if eng is not None and eng.section("spec"):
    e_model, e_tokens, e_budgets, e_ps = enginedata.spec_settings(eng)
    eb = bundles.load(refs_dir, [e_model])[e_model]
    e_dcfg = DrafterConfig.from_dict(eb.meta["drafter"])
    e_w = eb.weights()
    ref_grid = [(p, bud) for p in (engine_ref_ps or e_ps) for bud in (engine_ref_budgets or e_budgets)]
    ref_tau = {}
    for p, bud in progress(ref_grid, "reference τ"):
        r = ddtree_generate(eb.config, e_w, eb.prompt, e_tokens, drafter="oracle", budget=bud,
                            drafter_config=e_dcfg, oracle_p=p, oracle_seed=engine_oracle_seed)
        ref_tau[(float(p), int(bud))] = r.mean_accepted
    spec_rows = enginedata.spec_table(eng, e_model, ref_tau)
    ar_tps = enginedata.spec_ar_tok_s(eng, e_model)
    spec_df = tables.frame(spec_rows)
    tables.show_table(spec_df, "05_engine_spec", out_dir, digits=3, caption=(
        f"Measured speedup of DDTree over AR ({ar_tps:.0f} tok/s) by oracle p and budget: {e_model}, "
        f"{e_tokens} tokens per run, on {eng.hardware}, {eng.date}. The CSV adds tok/s, τ of the engine and "
        f"of the numpy reference (on {provenance.cpu_line()}) and µs per round."),
        view=spec_df.pivot(index="oracle_p", columns="budget", values="speedup"))
    checked = [r for r in spec_rows if r["same_tau"] is not None]
    best = "; ".join(f"p = {r['oracle_p']:g}: **{r['speedup']:.2f}×** at B = {r['budget']} "
                     f"(τ {r['tau_engine']:.2f})" for r in enginedata.best_budget(spec_rows))
    display(Markdown(f"Engine τ equals the reference τ in **{sum(r['same_tau'] for r in checked)} of "
                     f"{len(checked)}** runs checked here; DDTree tokens equal AR's in "
                     f"**{sum(bool(r['same_tokens_as_ar']) for r in spec_rows)} of {len(spec_rows)}** runs. "
                     f"Best measured speedup per oracle p: {best}."))
    fig, axes = plots.plt.subplots(1, 2, figsize=(11.5, 4))
    plots.lines(axes[0], {f"DDTree B={bud}": (e_ps, [r["ddtree_tok_s"] for r in spec_rows
                                                    if r["budget"] == bud]) for bud in e_budgets},
                "oracle p (top-1 accuracy per position)", "tokens/s",
                "DDTree vs AR tokens/s (measured)")
    axes[0].axhline(ar_tps, color="black", ls="--", lw=1, label=f"AR {ar_tps:.0f} tok/s")
    axes[0].legend(fontsize=7)
    plots.lines(axes[1], {f"p={p}": (e_budgets, [r["speedup"] for r in spec_rows
                                                 if r["oracle_p"] == p]) for p in e_ps},
                "tree budget B (nodes)", "speedup over AR (x, measured)",
                "measured speedup vs budget", logx=True)
    axes[1].axhline(1.0, color="gray", lw=0.8, ls=":")
    plots.finish(fig, "05_engine_spec", out_dir, plots.caption_text(
        f"{e_model}, oracle drafter, numba engine.", hardware=eng.hardware, date=eng.date))

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
fig, ax = plots.plt.subplots(figsize=(7, 4))
plots.lines(ax, {"measured (tree tokens, reference router)": (sizes, measured),
                 "analytic E(1-(1-k/E)^N)": (sizes, analytic)},
            "verify rows N (root + tree nodes)", "distinct routed experts touched per MoE layer",
            f"expert coverage, E={k2.n_routed_experts}, top-{k2.num_experts_per_tok}", logx=True)
ax.axhline(k2.n_routed_experts, color="gray", lw=0.8, ls=":")
plots.finish(fig, "05_expert_coverage", out_dir, plots.caption_text(
    f"{coverage_drafter} trees from {bundle_name}, random K2 router (seed {router_seed}), mean over "
    f"{coverage_trees} trees."))
tables.save_table(cov_rows, "05_expert_coverage", out_dir, "Measured and analytic coverage by verify rows")

# %% [markdown]
# ## Verify cost and speedup at K2 scale (bandwidth model, not measured)
# **A model, not a measurement:** one forward reads MLA, router and head in bf16 and the MLPs and
# the touched experts in INT4 (group size `group_size`), and takes time proportional to those
# bytes. KV-cache reads, activations, the drafter's own cost and compute limits are left out, so
# this is an upper bound on the speedup: τ(B) × bytes(1 row) / bytes(B + 1 rows), with the
# experts touched at B + 1 rows taken from the measured coverage above. Its inputs τ (reference,
# `bundle_name`) and coverage are measured; its outputs `cost_vs_decode` and `model_speedup` are
# not. For scale, the left panel also shows the verify cost the engine **measured** on the tiny
# model (time of B + 1 rows over the 1-row step): tiny2's step is latency-bound, not bandwidth-bound,
# so the two curves answer different questions and only the measured one is a time.

# %%
one = spec.forward_weight_bytes(k2, k2.num_experts_per_tok, group_size)   # one row touches exactly k experts
cost_rows = []
for row in acc_rows:
    n_rows = row["budget"] + 1
    touched = float(np.interp(n_rows, sizes, measured))
    bytes_b = spec.forward_weight_bytes(k2, touched, group_size)
    cost_rows.append({**row, "verify_rows": n_rows, "experts_touched": touched, "verify_GB": bytes_b / 1e9,
                      "cost_vs_decode": bytes_b / one, "model_speedup": row["tau"] * one / bytes_b})
fig, axes = plots.plt.subplots(1, 2, figsize=(11, 3.8))
cost_lines = {"MODEL: K2 weight bytes, B + 1 rows vs 1 row": (
    budgets, [r["cost_vs_decode"] for r in cost_rows if r["drafter"] == labels[0]])}
measured_note = ""
if eng is not None and eng.models("verify"):
    vm = eng.models("verify")[0]
    vrows = [r for r in enginedata.verify_table(eng, vm) if r["budget"] >= 1 and r["x_decode_step"]]
    if vrows:
        cost_lines[f"MEASURED: {vm} engine time, B + 1 rows vs 1 row"] = (
            [r["budget"] for r in vrows], [r["x_decode_step"] for r in vrows])
        measured_note = f" Measured engine line: {vm} on {eng.hardware}, {eng.date}."
plots.lines(axes[0], cost_lines, "tree budget (nodes)", "verify cost vs one decode row (x)",
            "verify cost: model vs measured", logx=True)
plots.lines(axes[1], {d: (budgets, [r["model_speedup"] for r in cost_rows if r["drafter"] == d])
                      for d in labels},
            "tree budget (nodes)", "speedup over AR (x, MODEL)", "speedup (bandwidth MODEL, not measured)",
            logx=True)
axes[1].axhline(1.0, color="gray", lw=0.8, ls=":")
plots.finish(fig, "05_speedup_model", out_dir, plots.caption_text(
    f"MODEL: K2 ({coverage_preset}) weight-bytes model, INT4 G={group_size}, not a measurement."
    f"{measured_note} "
    f"Model inputs τ and coverage: numpy reference on {bundle_name}."))
tables.save_table(cost_rows, "05_speedup_model", out_dir, "The MODEL's inputs and outputs by drafter, budget")

# %% [markdown]
# ## Full K2 per token from the measured k2_slice layers (projection from measurements)
# **Measured inputs, projected output.** `python -m workbench bench k2` timed the engine's whole
# dense layer and MoE layer of the seeded `k2_slice` (real K2 dimensions, INT4 experts, the router's
# own routing of random trees, context 4096) at 1 row and at B + 1 rows. Here one K2 step is its
# dense layer plus 60 MoE layers at those measured times, and tokens per round τ(B) is the oracle
# sweep above (numpy reference, `bundle_name`). Left out: embedding, final norm and lm_head, the
# drafter's forward and tree building; and the whole model (about 595 GB in INT4) does not fit one
# H200, so this is one GPU's measured layer speed applied to 61 layers, not a run.

# %%
k2_layers = k2proj.load_layers(engine_bench_dir)
if k2_layers is None:
    display(Markdown(f"**No `bench k2` result set in `{engine_bench_dir}`**: run `python -m workbench "
                     "bench k2` on a GPU; this section stays empty until then."))
else:
    k2_times, k2_meta = k2_layers
    proj_rows = []
    for d in labels:
        if not d.startswith("oracle"):
            continue
        tau_d = {r["budget"]: r["tau"] for r in acc_rows if r["drafter"] == d}
        proj_rows += [{"drafter": d, **r} for r in k2proj.project(preset("k2"), k2_times, tau_d)]
    proj = tables.frame(proj_rows)
    tables.show_table(proj, "05_k2_projection", out_dir, digits=3, caption=(
        f"PROJECTED full-K2 tokens/s on one GPU from MEASURED k2_slice layer times "
        f"({k2_meta.get('gpu', '?')}, commit {k2_meta.get('git_sha', '?')[:7]}, context "
        f"{k2_meta.get('context', '?')}, {k2_meta['dense_used']} dense projections) and the reference's "
        f"oracle τ on {bundle_name}; budget 0 = AR."),
        view=proj.pivot(index="drafter", columns="budget", values="speedup"))
    display(Markdown(f"Best projected budget per drafter: {k2proj.best_budgets(proj_rows)}."))
    fig, ax = plots.plt.subplots(figsize=(6, 3.8))
    plots.lines(ax, {d: ([r["budget"] for r in proj_rows if r["drafter"] == d and r["budget"]],
                         [r["speedup"] for r in proj_rows if r["drafter"] == d and r["budget"]])
                     for d in dict.fromkeys(r["drafter"] for r in proj_rows)},
                "tree budget B (nodes)", "speed-up over AR (x, PROJECTED)",
                "full K2 from measured layer times", logx=True)
    ax.axhline(1.0, color="gray", lw=0.8, ls=":")
    plots.finish(fig, "05_k2_projection", out_dir, plots.caption_text(
        f"PROJECTION: 1 dense + 60 MoE layers at the k2_slice times measured by bench k2 on "
        f"{k2_meta.get('gpu', '?')}; τ from the numpy reference on {bundle_name}; lm_head, drafter left out.",
        hardware=k2_meta.get("gpu", "?"), date=k2_meta.get("time_utc")))

# %% [markdown]
# ### The same projection against a measured K2-depth run (`bench depth`)
# `python -m workbench bench depth` runs a 61-layer K2.6-shape stand-in with **random weights** (the MoE
# layers cycling over 12 distinct weight sets, each read from HBM) end to end on one H200: AR, and DDTree
# at every budget with the DFlash-shape drafter in every round. `k2proj.depth_side_by_side` projects each
# run from that set's own measured parts (layers, lm_head, drafter, tree build, host) beside its measured
# ms per token ([docs/k2-depth.md](../docs/k2-depth.md)).

# %%
depth = k2proj.depth_side_by_side(engine_bench_dir)
if depth is None:
    display(Markdown(f"**No `bench depth` result set in `{engine_bench_dir}`**: run `python -m workbench "
                     "bench depth` on a GPU; this cell stays empty until then."))
else:
    depth_rows, depth_meta = depth
    depth_tab = tables.frame(depth_rows)
    tables.show_table(depth_tab, "05_k2_depth", out_dir, digits=3, caption=(
        f"MEASURED ms per token of the {depth_meta.get('weights', 'stand-in')} ({depth_meta.get('sets')} "
        f"distinct MoE sets; {depth_meta.get('gpu', '?')}, commit {str(depth_meta.get('git_sha', '?'))[:7]}) "
        "beside the PROJECTION from the same set's parts; budget 0 = AR."),
        view=depth_tab.pivot(index="source", columns="budget", values="ratio"))

# %% [markdown]
# ## Expert parallelism: each GPU's share of a K2 MoE layer (measured on one H200)
# With the 384 experts split over P GPUs (48 each at P = 8), a step's rows go to the GPUs holding
# their experts and the layer waits for the busiest GPU. `python -m workbench bench ep` splits the
# seeded `k2_slice` MoE layer (INT4 experts, its own router on random inputs) at P = 1, 2, 4, 8 and
# runs each rank's `fused_moe` over the rows it would receive **one rank after another on one
# H200**, after checking that the shares combined equal the whole layer. Measured: the busiest
# rank's time per step (a CUDA graph replay, L2 flushed), median over steps, and its floor (its
# distinct experts' INT4 bytes at the copy rate). **Not measured:** the two all-to-alls per layer
# that move the rows between GPUs, which need a machine of P GPUs; the same run checks and times
# the NCCL expert-parallel block with one rank only.

# %%
ep_set = k2proj.load_ep(engine_bench_dir)
ep_local8 = {}
if ep_set is None:
    display(Markdown(f"**No `bench ep` result set in `{engine_bench_dir}`**: run `python -m workbench "
                     "bench ep` on a GPU; this section stays empty until then."))
else:
    ep_table, ep_meta = ep_set
    ep_local8 = k2proj.ep_local(ep_table, 8)
    turn = tables.frame([{k: r[k] for k in ("world", "rows", "us", "floor_moe_us", "distinct_local_experts",
                                            "rows_received", "run")}
                         for r in ep_table if r["impl"] == "ranks in turn"])
    tables.show_table(turn, "05_ep_local_share", out_dir, digits=4, caption=(
        f"MEASURED on {ep_meta.get('gpu', '?')}: the busiest rank's local MoE (us) of the k2_slice MoE "
        "layer split over P GPUs, ranks run in turn on one GPU, by rows T (tree nodes + root); no "
        f"communication. Runs {', '.join(r['git_sha'] for r in ep_meta.get('runs', [ep_meta]))}."),
        view=turn.pivot(index="rows", columns="world", values="us"))
    checks = ep_meta.get("checks", [])
    nccl = [c for c in checks if c.get("impl") == "expert parallel"]
    display(Markdown(
        f"Checks: {sum(c['passed'] for c in checks)} of {len(checks)} passed (each row of the split, or "
        f"of the NCCL block, within {ep_meta.get('tol')} of the whole layer on one GPU). NCCL block "
        f"measured at P = {', '.join(str(p) for p in sorted({c['world'] for c in nccl})) or 'none'}: "
        "with one rank its exchanges are copies to itself, so it checks the bookkeeping, not scaling."))
    fig, ax = plots.plt.subplots(figsize=(6, 3.8))
    plots.lines(ax, {f"P = {p}": tuple(zip(*sorted(k2proj.ep_local(ep_table, p).items()), strict=True))
                     for p in sorted({int(w) for w in turn["world"]})},
                "rows T (tree nodes + root)", "busiest rank's local MoE (us)",
                "one MoE layer's experts on P GPUs", logx=True, logy=True)
    plots.finish(fig, "05_ep_local_share", out_dir, plots.caption_text(
        "MEASURED: each rank's fused_moe over the rows it would receive, ranks in turn on one GPU; the "
        "all-to-alls are not in it.", hardware=ep_meta.get("gpu", "?"), date=ep_meta.get("time_utc")))

# %% [markdown]
# ## The same per GPU of an 8-way expert-parallel node (projection from measurements)
# The whole model (about 595 GB in INT4) fits 8 H200s when each holds 48 of every layer's 384 experts
# (about 74 GB). At batch 1 each GPU still runs the dense layer, the attention, router and shared
# expert of every layer for the token (the **measured** layer time less its routed-experts part);
# only the routed experts split, and the layer waits for the busiest GPU's share: **measured** above
# (`bench ep`, P = 8) where that set exists, else its expected distinct experts under uniform routing
# (`k2proj.busiest_gpu_experts`) costed on the measured routed-experts time against distinct
# experts. Left out besides the one-GPU projection's: the two all-to-alls per MoE layer that carry a
# token's rows to its experts' GPUs and back (not measured: no multi-GPU machine has run `bench ep`).

# %%
if k2_layers is not None:
    ep_rows = []
    for d in labels:
        if not d.startswith("oracle"):
            continue
        tau_d = {r["budget"]: r["tau"] for r in acc_rows if r["drafter"] == d}
        ep_rows += [{"drafter": d, **r} for r in k2proj.project_ep(preset("k2"), k2_times, tau_d, world=8,
                                                                    local=ep_local8 or None)]
    ep = tables.frame(ep_rows)
    share = ("the busiest GPU's experts MEASURED by bench ep (ranks in turn on one GPU)" if ep_local8 else
             "the busiest GPU's experts from uniform routing on the measured experts curve")
    tables.show_table(ep, "05_k2_projection_ep8", out_dir, digits=3, caption=(
        f"PROJECTED full-K2 tokens/s per 8-GPU expert-parallel node from MEASURED k2_slice layer times "
        f"({k2_meta.get('gpu', '?')}, commit {k2_meta.get('git_sha', '?')[:7]}, {k2_meta['dense_used']} "
        f"dense projections), {share}, and the reference's oracle τ on {bundle_name}; the all-to-all is "
        "NOT measured (left out); budget 0 = AR."),
        view=ep.pivot(index="drafter", columns="budget", values="speedup"))
    display(Markdown("Best projected budget per drafter, 8-way expert parallel (its all-to-all not "
                     f"measured): {k2proj.best_budgets(ep_rows)}."))

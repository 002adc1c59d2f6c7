# %% [markdown]
# # 06 · The trained code pair: real acceptance on HumanEval
#
# Random drafters only ever accept the bonus token and the oracle is told the answer; this report
# shows what a drafter **trained on its target** achieves. The pair (`models/code*.kdtr`) is a small
# K2-architecture target (MLA with the latent cache, 32 routed experts top-4 + 1 shared, sigmoid
# noaux_tc router, first layer dense, YaRN) trained on pinned Python packages, and a DFlash drafter
# (block 16, taps of all four target layers) trained on the target's own greedy continuations
# (docs/training.md). It opens with the workbench's answer at K2 depth (the index page's table and
# figure), then:
#
# 1. training: losses, the router's expert load, the drafter's accuracy (from the H200 run's reports);
# 2. a live check on this machine: DDTree with the trained drafter gives exactly the AR tokens;
# 3. τ against the DDTree budget on the first HumanEval prompts, the plain DFlash chain beside it,
#    greedy and at T = 1, for the BF16 target and its INT4 copies (`measure`, numpy reference);
# 4. accepted-length histograms; 5. the experts a real tree touches against the uniform-routing curve;
# 6. FP vs INT4 drift over long generations; 7. DDTree against AR on the GPU engine (`bench pair`);
# 8. the full-K2 projection of notebook 05 redone with this pair's τ(B).
#
# Sections 1, 3-7 read committed results (each names its machine and commit); section 2 and 8
# compute here.

# %%
from pathlib import Path

import numpy as np
from IPython.display import Markdown, display

from workbench import k2proj
from workbench.bench.pair import best as pair_best
from workbench.bench.pair import draw as draw_pair
from workbench.bench.pair import summarize as pair_summary
from workbench.config import preset
from workbench.generate import generate
from workbench.report import depthdata, headline, pairdata, plots, provenance, tables
from workbench.report.paths import enter_repo
from workbench.train.measure import analytic_union, humaneval_prompts, load_pair

enter_repo()  # relative paths below name the repository's files, wherever the kernel started

# %% tags=["parameters"]
bundle = "models/code.kdtr"
train_dir = "reports/train"
measure_dir = "reports/measure"
bench_dir = "reports/bench"
depth_bench_dir = "reports/bench"
live_prompt = "HumanEval/8"
live_tokens = 48
live_budget = 16
hist_budgets = [4, 16, 64]
out_dir = "reports/local"
profile = "full"
device = "auto"

# %%
dev = provenance.resolve_device(device)
display(Markdown(provenance.run_line(profile, device)))
pair = load_pair(bundle, "code")
cfg, dcfg = pair.cfg, pair.dcfg

# %% [markdown]
# ## The answer: at K2 depth, which budget pays off and by how much
# The same table and figure as on the index page: per acceptance source (AR, the oracle at each p, this
# pair's accepted lengths replayed) the best DDTree budget of the `bench depth` run, its tokens/s
# **measured** and **projected** and the speed-ups over AR; every number names where it ran. Without a
# `bench depth` result set it says so and shows the projection alone. Where the time goes: notebook 05.

# %%
answer = headline.build(depth_bench_dir)
display(Markdown(f"**{answer['answer']}**"))
if answer.get("not_measured"):
    display(Markdown(f"**{answer['not_measured']}**"))
if answer["rows"]:
    tables.show_table(headline.table_rows(answer), "06_headline", out_dir, digits=3,
                      caption=" ".join(answer["labels"]))
    plots.finish(headline.figure(answer), "06_headline", out_dir, plots.caption_text(
        "Solid: MEASURED by bench depth; dashed: PROJECTED." if answer["status"] == "measured" else
        "PROJECTED from bench k2's layer times and the pair's τ; nothing at K2 depth measured yet.",
        hardware=answer["hardware"], date=answer["date"]))

# %% [markdown]
# ## 1. Training (measured on the GPU that trained the pair)
# The target's held-out loss (64 windows of 1024 tokens of held-out files), its loss on the HumanEval
# prompts' own tokens, the experts' load on held-out text (1.0 = perfectly even; max and min over the
# mean, coefficient of variation, per MoE layer), and the drafter's top-1 accuracy per drafted position
# and chain length on held-out continuations, for random windows and for windows that end where a
# function body starts.

# %%
tr = pairdata.load_training(train_dir)
if tr is None:
    display(Markdown(f"**No training run in `{train_dir}`**: `python -m workbench train all` on a GPU."))
else:
    t, d = tr["target"], tr["drafter"]
    ev = t["eval"]
    tables.show_table([{"steps": t["steps"], "final_train_loss": t["final_train_loss"],
                        "heldout_loss": ev["heldout_loss"],
                        "humaneval_prompt_loss": ev["humaneval_prompt_loss"],
                        "seconds": t["seconds"], "device": t["device"], "torch": t["torch"]}],
                      "06_target", out_dir, caption=f"Target training, {tr['dir']}.")
    load = ev["expert_load"]
    tables.show_table([{"moe_layer": i + 1, "max_over_mean": load["max_over_mean"][i],
                        "min_over_mean": load["min_over_mean"][i], "cv": load["cv"][i]}
                       for i in range(len(load["cv"]))], "06_expert_load", out_dir,
                      caption="Routed-expert load on held-out text (bias balancing, no auxiliary loss).")
    de = d["eval"]
    tables.show_table([{"steps": d["steps"], "final_train_loss": d["final_train_loss"],
                        "chain_accepted_len": de["chain_accepted_len"],
                        **{f"chain_{k}": v for k, v in de.get("chain_accepted_len_by_prompt", {}).items()},
                        "top1_pos1": de["top1_by_position"][0], "top1_pos15": de["top1_by_position"][-1]}],
                      "06_drafter", out_dir, caption="Drafter training; the chain length counts the bonus.")
    fig, ax = plots.plt.subplots(1, 2, figsize=(11, 3.6))
    plots.lines(ax[0], {p: ([e["step"] for e in tr[f"{p}_steps"]], [e["loss"] for e in tr[f"{p}_steps"]])
                        for p in ("target", "drafter")}, "step", "training loss (nats)", "loss")
    plots.lines(ax[1], {"drafter": (range(1, len(de["top1_by_position"]) + 1), de["top1_by_position"])},
                "drafted position", "top-1 accuracy", "drafter accuracy by position", integer_x=True)
    plots.finish(fig, "06_training", out_dir, plots.caption_text(
        f"Training logs of {tr['dir'].name}.", hardware=f"{tr['gpu'] or t['device']} (torch {t['torch']})",
        date=f"run {tr['dir'].name}"))

# %% [markdown]
# ## 2. Live: DDTree with the trained drafter equals AR (computed here)
# Greedy AR and greedy DDTree (budget `live_budget`, the bundle's DFlash drafter) on the HumanEval
# prompt `live_prompt`, numpy reference. The continuation is printed as text. The target is a 4-layer
# model trained for minutes: its greedy text repeats itself within a few lines on many prompts (on the
# bundle's golden prompt, HumanEval/2, one `if` line over and over); `live_prompt` is one where it
# reads as a function body. What this section checks is that DDTree gives AR's tokens, not their quality.

# %%
prompt = dict(humaneval_prompts(pair.tok, int(live_prompt.split("/")[1]) + 1))[live_prompt]
ar = generate(cfg, pair.weights, prompt, live_tokens)
dd = generate(cfg, pair.weights, prompt, live_tokens, mode="ddtree", budget=live_budget, drafter_config=dcfg)
same = bool((ar.tokens == dd.tokens).all())
verdict = "identical to AR" if same else "DIFFERS FROM AR"
display(Markdown(f"DDTree B = {live_budget}: **{verdict}** over {live_tokens} tokens, "
                 f"τ = {dd.mean_accepted:.2f} tokens per round, {len(dd.rounds)} rounds."))
if not same:
    live = {"model": "code", "prompt": live_prompt, "budgets": [live_budget], "chain": False}
    display(Markdown(pairdata.near_tie_text(live, pairdata.near_tie(cfg, pair.weights, dcfg, prompt,
                                                                    live_tokens, live_budget))))
display(Markdown("```python\n" + pair.tok.decode(prompt.tolist()).rstrip()[-300:] + "\n# --- generated ---\n"
                 + pair.tok.decode(ar.tokens.tolist()) + "\n```"))

# %% [markdown]
# ## 3. τ against the budget on HumanEval (measured, numpy reference)
# `python -m workbench measure models/code.kdtr --int4 models/code_int4_experts.kdtr
# models/code_int4_mlp.kdtr`: DDTree at each budget and the plain DFlash chain (the drafter's 15
# argmax tokens as one path) on the first HumanEval prompts; every greedy run is checked token for
# token against greedy AR. τ counts the bonus token.

# %%
ms = pairdata.load_measure(measure_dir)
ties = {}                                 # (model, prompt) -> near-tie measured here, shared with section 7
if ms is None:
    display(Markdown(f"**No measure run in `{measure_dir}`.**"))
else:
    acc, drift, mdir = ms
    lab = acc["labels"]
    stamp = f"commit {lab['commit'][:7]}"
    where = f"{lab['prompts']} x {lab['new_tokens']} tokens"                 # figure captions add the rest
    cells = pairdata.cells(acc)
    tables.show_table(pairdata.best(acc), "06_best", out_dir, digits=3,
                      caption=f"Best DDTree budget per model and temperature, and the DFlash chain; {where}, "
                              f"{lab['machine']}, {stamp}.")
    greedy_ok = {m: v["summary"]["all_equal_ar"] for m, v in acc["models"].items()}
    display(Markdown("Greedy DDTree and chain tokens equal greedy AR on every prompt: "
                     + ", ".join(f"{m}: **{ok}**" for m, ok in greedy_ok.items()) + "."))
    for note in pairdata.departure_notes([r for v in acc["models"].values() for r in v["rows"]],
                                         lab["new_tokens"], Path(bundle).parent, ties):
        display(Markdown(note))                      # each run not equal to AR, with its measured near-tie
    temps = sorted({c["temperature"] for c in cells})
    fig, ax = plots.plt.subplots(1, len(temps), figsize=(5.5 * len(temps), 3.8), squeeze=False)
    for a, temp in zip(ax[0], temps, strict=True):
        series = {m: tuple(zip(*sorted(pairdata.tau_by_budget(acc, m, temp).items()), strict=True))
                  for m in acc["models"]}
        plots.lines(a, series, "budget B (nodes)", "τ (tokens per round)", f"T = {temp:g}", logx=True)
        for m in acc["models"]:
            chain = next((c["tau"] for c in cells if c["model"] == m and c["tree"] == "chain"
                          and c["temperature"] == temp), None)
            if chain is not None:
                a.axhline(chain, ls=":", lw=1, color=a.lines[list(acc["models"]).index(m)].get_color())
    plots.finish(fig, "06_tau_budget", out_dir, plots.caption_text(
        f"DDTree τ(B) (lines) and the DFlash chain (dotted), {where}.", hardware=lab["machine"],
        date=stamp))
    tables.save_table([{k: v for k, v in c.items() if k != "accepted_hist"} for c in cells], "06_acceptance",
                      out_dir, "τ, verify size and distinct experts per (model, temperature, tree, budget)")

# %% [markdown]
# ## 4. Accepted lengths (measured)
# Rounds per accepted length (bonus included) summed over prompts, greedy, BF16 target.

# %%
if ms is not None:
    sel = [c for c in cells if c["model"] == "code" and c["temperature"] == 0
           and (c["tree"] == "chain" or c["budget"] in hist_budgets)]
    fig, ax = plots.plt.subplots(1, len(sel), figsize=(3.4 * len(sel), 3.2), squeeze=False)
    for a, c in zip(ax[0], sel, strict=True):
        name = "chain" if c["tree"] == "chain" else f"DDTree B = {c['budget']}"
        plots.histogram(a, c["accepted_hist"], name)
    plots.finish(fig, "06_accept_hist", out_dir,
                 plots.caption_text(where, hardware=lab["machine"], date=stamp))

# %% [markdown]
# ## 5. Experts a real tree touches (measured) against uniform routing (model)
# Distinct routed experts per MoE layer of each verify forward (mean over layers and rounds) against
# E·(1 − (1 − k/E)^N) for the same number N of verify tokens routed uniformly at random. A ratio under
# 1 means the trained router sends a tree's tokens to shared experts, which is what makes a verify
# cheaper than the uniform model says.

# %%
if ms is not None:
    dd0 = [c for c in cells if c["model"] == "code" and c["temperature"] == 0 and c["tree"] == "ddtree"]
    n = sorted(c["verify_tokens"] for c in dd0)
    fig, ax = plots.plt.subplots(figsize=(6, 3.8))
    uniform = analytic_union(cfg.n_routed_experts, cfg.num_experts_per_tok, n)
    plots.lines(ax, {"measured (BF16 target, greedy)": (n, [c["experts"] for c in sorted(
                         dd0, key=lambda c: c["verify_tokens"])]),
                     "uniform routing": (n, uniform)},
                "verify tokens N (root + nodes)", "distinct experts per MoE layer", logx=True)
    plots.finish(fig, "06_expert_union", out_dir, plots.caption_text(
        f"E = {cfg.n_routed_experts}, top-{cfg.num_experts_per_tok}; {where}.", hardware=lab["machine"],
        date=stamp))

# %% [markdown]
# ## 6. FP vs INT4 drift over long generations (measured)
# First step where the INT4 target's greedy text leaves the BF16 target's, and, teacher-forced along
# the BF16 target's greedy text, KL(BF16 ‖ INT4) per position (nats) and how often the two agree on
# the top-1 token.

# %%
if ms is not None and drift is not None:
    dl = drift["labels"]
    tables.show_table(pairdata.drift_table(drift), "06_drift", out_dir, digits=4, caption=(
        f"{dl['prompts']} x {dl['new_tokens']} tokens, {dl['machine']}, commit {dl['commit'][:7]}; "
        "first_divergence None = identical throughout."))
    fig, ax = plots.plt.subplots(figsize=(7, 3.4))
    window = 32
    for m in dict.fromkeys(r["model"] for r in drift["runs"]):
        kl = np.mean([r["kl"] for r in drift["runs"] if r["model"] == m], axis=0)       # [L] over prompts
        ax.plot(np.convolve(kl, np.ones(window) / window, mode="valid"), lw=1, label=m)
    ax.set_yscale("log")
    ax.set_xlabel(f"generated position (running mean over {window})")
    ax.set_ylabel("KL(BF16 || INT4), nats")
    ax.legend(fontsize=7)
    plots.finish(fig, "06_drift", out_dir, plots.caption_text(
        f"Teacher-forced along the BF16 text, mean over {dl['prompts']}.",
                                                              hardware=dl["machine"],
                                                              date=f"commit {dl['commit'][:7]}"))

# %% [markdown]
# ## 7. DDTree against AR on the GPU engine (measured)
# `python -m workbench bench pair`: greedy AR (graph-replayed decode step) and DDTree with the DFlash
# drafter on the device, per HumanEval prompt, on the H200. tokens/s is the decode phase over all
# prompts together; the round's time splits into draft (drafter + top-k + copy back), host tree build
# and verify.

# %%
pb = pairdata.load_pair_bench(bench_dir)
if pb is None:
    display(Markdown(f"**No `bench pair` result set in `{bench_dir}`** (run it on a GPU)."))
else:
    rows, meta, path = pb
    summary = pair_summary(rows)
    for note in pairdata.departure_notes(rows, int(meta.get("new_tokens", 128)), Path(bundle).parent, ties):
        display(Markdown(note))
    tables.show_table(summary, "06_engine_pair", out_dir, digits=3, caption=(
        f"Measured on {meta.get('gpu', '?')}, {meta.get('prompts', '?')} x {meta.get('new_tokens', '?')} "
        f"tokens, commit {meta.get('git_sha', '?')[:7]} ({path})."))
    fig, ax = plots.plt.subplots(figsize=(6.5, 3.8))
    draw_pair(ax, summary)
    plots.plain_ticks(ax.xaxis)
    plots.finish(fig, "06_engine_pair", out_dir, plots.caption_text(
        "Best DDTree budget per bundle: " + "; ".join(
            f"{m} {c['speedup']:.2f}x AR at B = {c['budget']}" for m, c in pair_best(summary).items()) + ".",
        hardware=meta.get("gpu"), date=meta.get("time_utc")))

# %% [markdown]
# ## 8. Full K2 with this pair's τ(B) (projection from measurements)
# Notebook 05's projection (1 dense + 60 MoE layers at the `bench k2` layer times measured on the
# k2_slice, context 4096, INT4 experts) with the trained pair's greedy τ(B) on HumanEval in place of
# the oracle's; and a second line that also scales each MoE layer's routed-experts part by the pair's
# measured expert ratio at that budget (section 5), since the k2_slice's seeded router spreads a
# tree's tokens like uniform routing. That ratio was measured at E = 32, top-4 and is carried over to
# K2's E = 384, top-8 as is. Left out as in 05: lm_head, the drafter, tree building, and that 61
# layers do not fit one GPU. A third line is notebook 05's per-GPU projection of an 8-way
# expert-parallel node (each GPU runs the non-expert part, the busiest GPU's share of the experts,
# measured by `bench ep` where its set exists, bounds the layer; the all-to-alls are left out).

# %%
k2_layers = k2proj.load_layers(bench_dir)
ep_set = k2proj.load_ep(bench_dir)
ep_local8 = k2proj.ep_local(ep_set[0], 8) if ep_set else {}
if k2_layers is None or ms is None:
    display(Markdown("**Needs both the `bench k2` result set and the measure run.**"))
else:
    k2_times, k2_meta = k2_layers
    proj_rows = []
    for m in acc["models"]:
        tau_m = pairdata.tau_by_budget(acc, m, 0.0)
        proj_rows += [{"model": m, "experts": "uniform (as measured)", **r}
                      for r in k2proj.project(preset("k2"), k2_times, tau_m)]
        proj_rows += [{"model": m, "experts": "pair's overlap ratio", **r} for r in k2proj.project(
            preset("k2"), k2_times, tau_m, overlap=pairdata.overlap_by_budget(acc, m, 0.0))]
        proj_rows += [{"model": m, "experts": "per GPU of 8-way expert parallel", **r}
                      for r in k2proj.project_ep(preset("k2"), k2_times, tau_m, world=8,
                                                 local=ep_local8 or None)]
    tables.show_table(proj_rows, "06_k2_projection", out_dir, digits=3, caption=(
        f"PROJECTED full-K2 tokens/s from MEASURED k2_slice layers ({k2_meta.get('gpu', '?')}, commit "
        f"{k2_meta.get('git_sha', '?')[:7]}, {k2_meta['dense_used']} dense projections) and the MEASURED "
        f"greedy τ(B) of the trained pair; the 8-way expert-parallel rows leave out the all-to-all, which is "
        "NOT measured; budget 0 = AR."))
    for kind in dict.fromkeys(r["experts"] for r in proj_rows):
        line = [r for r in proj_rows if r["model"] == "code" and r["experts"] == kind]
        top = max(line, key=lambda r: r["speedup"])
        ar = next(r for r in line if r["budget"] == 0)                 # AR on the same line's layers
        display(Markdown(f"Best projected budget, BF16 pair's τ, experts {kind}: **B = {top['budget']}**, "
                         f"**{top['speedup']:.2f}×** AR ({top['tok_s']:.1f} tok/s against "
                         f"{ar['tok_s']:.1f})."))

# %% [markdown]
# ### The same acceptance at K2 depth, measured (`bench depth`)
# This pair's accepted lengths replayed on the `bench depth` stand-in (61 layers at K2.6's dimensions,
# **random weights, not K2's**): ms per token = its measured round time at B over the pair's τ(B),
# beside the projection from that run's measured parts (which, unlike the rows above, include the
# embedding, lm_head, the drafter, tree building and the host).

# %%
depth = depthdata.load_depth(depth_bench_dir)
if depth is None or depth.dry_run:
    display(Markdown(f"**Not measured yet**: no `bench depth` result set in `{depth_bench_dir}` "
                     "(`python -m workbench bench depth` on a GPU)."))
else:
    replayed = [r for r in depthdata.side_by_side(depth) if r["source"] in ("ar", "pair code (replayed)")]
    tables.show_table(replayed, "06_depth_pair", out_dir, digits=3, caption=(
        f"{depth.label}: the {depth.stand_in}; measured_* from the run, projected_* from its measured "
        "parts; budget 0 = AR."))

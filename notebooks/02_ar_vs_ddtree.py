# %% [markdown]
# # 02 · AR vs DDTree: greedy-exact on every bundle and backend
#
# Greedy DDTree must emit exactly the tokens greedy autoregressive (AR) decoding emits: the tree
# only changes how many target forwards it takes, never what the target chooses. This report runs
# AR and DDTree on every golden bundle, on the numpy reference and on the numba engine, over node
# budgets and both drafters, and checks every run against the bundle's golden tokens. Then it
# shows how many tokens each round accepted, and draws one round's draft tree.
#
# Drafters: `dflash` is the block drafter stored in each bundle. Its weights are **random** (the
# golden bundles are random models), so it rarely guesses right and rounds accept about one token:
# it exercises the machinery, not a trained drafter. `oracle` knows the true continuation and puts
# it on top with probability `oracle_p`, which is how acceptance is swept here and in report 05.

# %%
import numpy as np
from IPython.display import Markdown, display

from workbench.ddtree import DrafterConfig
from workbench.generate import generate
from workbench.report import bundles, plots, provenance, spec, tables
from workbench.report.paths import enter_repo
from workbench.report.progress import progress

enter_repo()  # relative paths below name the repository's files, wherever the kernel started

# %% tags=["parameters"]
bundle_names = ["tiny", "tiny2", "int4_tiny", "int4_tiny2"]
backends = ["reference", "numba"]
budgets = [1, 4, 16, 64]
drafters = ["dflash", "oracle"]
oracle_p = 0.8
n_tokens = 32
sim_bundles = ["tiny"]
sim_tokens = 6
sim_budgets = [4]
sim_drafters = ["oracle"]
draw = {"bundle": "tiny", "drafter": "oracle", "budget": 16, "round": 0}
refs_dir = "refs"
out_dir = "reports/local"
profile = "full"
device = "auto"

# %%
dev = provenance.use_device(device)
display(Markdown(provenance.run_line(profile, device)))
refs = bundles.load(refs_dir, bundle_names)
drafter_cfgs = {n: DrafterConfig.from_dict(b.meta["drafter"]) for n, b in refs.items()}
plan = []
for backend in backends:
    simulated = backend == "numba" and dev == "cpu"
    for name in ([n for n in sim_bundles if n in refs] if simulated else bundle_names):
        n = min(sim_tokens if simulated else n_tokens, len(refs[name].golden))
        plan.append((name, backend, "ar", "", 0, n))
        plan += [(name, backend, "ddtree", d, bud, n) for d in (sim_drafters if simulated else drafters)
                 for bud in (sim_budgets if simulated else budgets)]
if "numba" in backends and dev == "cpu":
    display(Markdown("**No GPU here:** the numba engine runs in numba's CUDA simulator, which is slow, "
                     f"so it covers only {', '.join(sim_bundles)}, {sim_tokens} tokens, budgets "
                     f"{sim_budgets} and drafters {sim_drafters}. On a GPU every case runs on it."))
if "numba" not in backends:
    display(Markdown("**The numba engine is not part of this profile** (`backends` = reference only)."))

# %% [markdown]
# ## Greedy-exact table
# Every run is checked against the bundle's golden tokens (the reference's greedy decoding recorded
# when the bundle was built): the line below the table counts the runs that reproduce them. The
# table shows each DDTree run's mean accepted tokens per round, bonus token included (AR emits one
# token per forward); an empty cell is a case this device does not run. The CSV has one row per
# run with `equals_golden`, rounds and wall-clock time of the whole call on this machine (set-up
# and, for the engine, compilation included, so not a benchmark).

# %%
results, rows = {}, []
for name, backend, mode, drafter, budget, n in progress(plan, "runs"):
    b = refs[name]
    r = generate(b.config, b.weights(), b.prompt, n, backend=backend, mode=mode, drafter=drafter or "dflash",
                 budget=max(budget, 1), drafter_config=drafter_cfgs[name], oracle_p=oracle_p)
    results[name, backend, mode, drafter, budget] = r
    rows.append({"bundle": name, "backend": backend, "mode": mode, "drafter": drafter, "budget": budget or "",
                 "tokens": n, "equals_golden": bool(np.array_equal(r.tokens, b.golden[:n])),
                 "rounds": len(r.rounds) or n,
                 "mean_accepted": r.mean_accepted,
                 "wall_s": r.seconds})
runs = tables.frame(rows)
accepted = runs[runs["mode"] == "ddtree"].pivot_table(index=["bundle", "backend"],
                                                       columns=["drafter", "budget"], values="mean_accepted",
                                                       sort=False)
where = {"reference": f"numpy on {provenance.cpu_line()}",
         "numba": f"the engine on {provenance.hardware_line()}" if dev == "gpu"
         else f"the engine in numba's CUDA simulator on {provenance.cpu_line()}"}
tables.show_table(runs, "02_greedy_exact", out_dir, view=accepted, caption="Mean accepted tokens per round. "
                  + "; ".join(f"{b}: {where[b]}" for b in backends if b in where) + ".")
bad = [r for r in rows if not r["equals_golden"]]
display(Markdown(f"**{len(rows) - len(bad)} of {len(rows)} runs reproduce the golden tokens.**"
                 + ("" if not bad else " Mismatches: " + ", ".join(
                     f"{r['bundle']}/{r['backend']}/{r['mode']}/{r['drafter']}/{r['budget']}" for r in bad))))

# %% [markdown]
# ## Accepted length per round, by budget and drafter
# Reference backend, all bundles pooled. The accepted length counts the bonus token, so 1 means
# the target rejected the drafter's first token; the most a round can accept is the block size.

# %%
ref_runs = {k: v for k, v in results.items() if k[1] == "reference" and k[2] == "ddtree"}
max_len = max(c.block_size for c in drafter_cfgs.values())
hist_rows = []
used_budgets = sorted({k[4] for k in ref_runs})
fig, axes = plots.plt.subplots(len(drafters), len(used_budgets), squeeze=False,
                               figsize=(3.2 * len(used_budgets), 2.9 * len(drafters)))
for i, d in enumerate(drafters):
    for j, bud in enumerate(used_budgets):
        rounds = [x for k, v in ref_runs.items() if k[3] == d and k[4] == bud for x in v.rounds]
        counts = spec.accepted_histogram(rounds, max_len)
        hist_rows += [{"drafter": d, "budget": bud, "accepted_len": a, "rounds": int(c)}
                      for a, c in enumerate(counts)]
        plots.histogram(axes[i][j], counts, f"{d}, budget {bud}")
plots.finish(fig, "02_accept_hist", out_dir, plots.caption_text(
    f"Reference backend, {len(refs)} bundles, {n_tokens} tokens each, oracle p = {oracle_p}."))
tables.save_table(hist_rows, "02_accept_hist", out_dir, "Rounds per accepted length, drafter and budget")

# %% [markdown]
# ## One round's draft tree
# Nodes are drafted tokens (ids), placed by depth; green is the path the target accepted, the
# orange square the bonus token the target emitted after it (its own choice, drafted or not).

# %%
b = refs[draw["bundle"]]
trace = spec.capture_round(b.config, b.weights(), b.prompt, n_tokens, draw["round"],
                           drafter=draw["drafter"], budget=draw["budget"],
                           drafter_config=drafter_cfgs[draw["bundle"]], oracle_p=oracle_p)
fig, ax = plots.plt.subplots(figsize=(9, max(3.0, 0.22 * trace.tree.n_nodes)))
plots.draw_round(ax, trace)
plots.finish(fig, "02_tree", out_dir, plots.caption_text(
    f"{draw['bundle']}, {draw['drafter']} drafter, budget {draw['budget']}, round {draw['round']}, "
    "reference backend."))

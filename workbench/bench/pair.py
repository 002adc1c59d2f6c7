"""``python -m workbench bench pair``: DDTree against AR on the GPU engine for the trained code pair.

For each bundle (the BF16 pair and its INT4 copies) and each of the first N HumanEval prompts: greedy
AR decode of M tokens (graph-replayed decode step) and DDTree with the pair's DFlash drafter on the
device at every budget, on one engine per bundle. Per run: tokens/s of the decode phase (after the
prefill, which both share), tau (tokens per round, bonus included), the round's split into draft
(drafter + top-k + copy back), host tree build and verify, and whether the tokens equal AR's.
Summary per (bundle, budget): tokens/s over all prompts together (total tokens / total time), its
ratio to AR's, tau as ``measure`` gives it (the mean of the prompts' taus) and the tokens per round
over all rounds together (what the tokens/s follow).
With ``cost_aware``: after the fixed budgets, each bundle's cost curve is read off those same runs
(``cost_curve``: verify time per round at B + 1 rows, the rest of a round at the largest budget), and
every prompt runs once more with the cost-aware budget over it (mode ``ddtree_auto``, budget = the
largest B; docs/ddtree.md) and with the first pass's best fixed budget again (mode ``ddtree_best``), the
two in turn first, so the comparison is one pass, prompt by prompt. The curves go into the JSON as
``cost_curves`` (``generate --budget auto --cost-curve pair_<commit>.json:MODEL`` reads them).
The CSV and JSON are rewritten after each bundle (``bundles_done``, ``complete``), so a run cut short
keeps what it measured. Writes the result set ``pair_<commit>.csv / .json / .png``
(workbench/results.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..fileio import save_figure_atomic, write_json_atomic
from ..results import ResultSet, result_set, write_csv
from .common import require_gpu, run_metadata

BUNDLES = ("models/code.kdtr", "models/code_int4_experts.kdtr", "models/code_int4_mlp.kdtr")
BUDGETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
WARM_TOKENS = 16
PARTS = ("draft", "build", "verify")           # the round's phases (engine.ddtree timing)


def _pair(path: str):
    from ..bundle import read_bundle
    from ..ddtree.config import DrafterConfig
    b = read_bundle(path)
    if not isinstance(b.meta.get("drafter"), dict):
        raise InputError(f"{path} has no drafter config (meta.drafter)")
    return b.config, b.weights(), DrafterConfig.from_dict(b.meta["drafter"])


def bench_bundle(path: str, prompts: list[tuple[str, np.ndarray]], n_tokens: int, budgets: tuple[int, ...],
                 rows: list[dict[str, Any]], cost_aware: bool = False, progress=None) -> Any:
    """AR and DDTree at every budget for each prompt on one engine; one row per (prompt, mode, budget).
    cost_aware: then the cost-aware budget over this bundle's measured curve, returned (else None).
    progress: ``progress(done, total, what)`` before each prompt."""
    from ..ddtree.budget import TreeBudget
    from ..engine.ar import engine_for
    from ..generate import generate
    cfg, w, dcfg = _pair(path)
    name = Path(path).stem
    eng = engine_for(cfg, w, max(len(ids) for _, ids in prompts), n_tokens, max(budgets),
                     taps=dcfg.target_layer_ids)
    spec = dict(backend="numba", mode="ddtree", drafter="dflash", drafter_config=dcfg, engine=eng)
    first = prompts[0][1]
    generate(cfg, w, first, WARM_TOKENS, backend="numba", engine=eng)             # capture + warm-up
    for budget in budgets:
        generate(cfg, w, first, WARM_TOKENS, budget=budget, **spec)
    ar_tokens = {}
    step = progress or (lambda done, total, what: None)
    total = len(prompts) * (2 if cost_aware else 1)

    def ddtree_row(ids: np.ndarray, base: dict, mode: str, budget: Any, label: int) -> dict:
        t: dict = {}
        r = generate(cfg, w, ids, n_tokens, budget=budget, **spec, timing=t)
        n = len(r.rounds)
        return dict(base, mode=mode, budget=label, seconds=t["decode_s"],
                    tok_s=(n_tokens - 1) / t["decode_s"], tau=r.mean_accepted, rounds=n,
                    nodes_per_round=sum(x.tree_size for x in r.rounds) / n,
                    **{f"{k}_us_per_round": t[f"{k}_s"] / n * 1e6 for k in PARTS},
                    tokens_equal_ar=bool(np.array_equal(r.tokens, ar_tokens[base["prompt"]])))

    for j, (task, ids) in enumerate(prompts):
        step(j, total, f"{name} prompt {j + 1}/{len(prompts)}, AR and B in {list(budgets)}")
        t: dict = {}
        ar = generate(cfg, w, ids, n_tokens, backend="numba", engine=eng, timing=t)
        ar_tokens[task] = ar.tokens
        ar_tps = (n_tokens - 1) / t["decode_s"]
        base = dict(model=name, prompt=task, prompt_tokens=len(ids), tokens=n_tokens - 1)
        rows.append(dict(base, mode="ar", budget=0, seconds=t["decode_s"], tok_s=ar_tps, tau=1.0,
                         rounds=n_tokens - 1, tokens_equal_ar=True))
        for budget in budgets:
            rows.append(ddtree_row(ids, base, "ddtree", budget, budget))
    if not cost_aware:
        return None
    curve = cost_curve([c for c in summarize([r for r in rows if r["model"] == name])
                        if c["mode"] == "ddtree"])
    auto = TreeBudget(curve.max_budget, curve)
    fixed = best(summarize([r for r in rows if r["model"] == name]))[name]["budget"]
    generate(cfg, w, first, WARM_TOKENS, budget=auto, **spec)                    # captures its sizes
    for j, (task, ids) in enumerate(prompts):                # the best fixed budget again, beside it
        step(len(prompts) + j, total, f"{name} prompt {j + 1}/{len(prompts)}, cost-aware B and B = {fixed}")
        base = dict(model=name, prompt=task, prompt_tokens=len(ids), tokens=n_tokens - 1)
        pass2 = [("ddtree_auto", auto, auto.max_nodes), ("ddtree_best", fixed, fixed)]
        for mode, budget, label in pass2[::1 if j % 2 == 0 else -1]:           # in turn first
            rows.append(ddtree_row(ids, base, mode, budget, label))
    return curve


def cost_curve(cells: list[dict[str, Any]]) -> Any:
    """The cost curve of one bundle from ``summarize``'s fixed-budget DDTree cells: verify time per round
    at B + 1 rows, and round_us = the rest of a round (drafter, top-k, host build, walk, commit) at the
    largest B, the tree a cost-aware round builds before it cuts."""
    from ..ddtree.budget import CostCurve
    cells = sorted(cells, key=lambda c: c["budget"])
    if not cells or any("verify_us_per_round" not in c for c in cells):
        raise InputError("a cost curve needs the fixed budgets' verify times")
    top = cells[-1]
    round_us = 1e6 * top["tokens_per_round"] / top["tok_s"] - top["verify_us_per_round"]   # per round
    return CostCurve(rows=tuple(int(c["budget"]) + 1 for c in cells),
                     verify_us=tuple(float(c["verify_us_per_round"]) for c in cells),
                     round_us=max(float(round_us), 0.0))


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, mode, budget): tokens/s over all prompts (total tokens / total seconds), the speed-up
    over the same model's AR, tau (mean over prompts), tokens per round (over all rounds), the round's
    split, and whether every run equalled AR."""
    out = []
    keys = sorted({(r["model"], r["mode"], r["budget"]) for r in rows}, key=lambda k: (k[0], k[2], k[1]))
    ar_tps = {}
    for model, mode, budget in keys:
        sel = [r for r in rows if (r["model"], r["mode"], r["budget"]) == (model, mode, budget)]
        tps = sum(r["tokens"] for r in sel) / sum(r["seconds"] for r in sel)
        if mode == "ar":
            ar_tps[model] = tps
        rounds = sum(r["rounds"] for r in sel)
        cell = dict(model=model, mode=mode, budget=budget, prompts=len(sel), tok_s=tps,
                    speedup=tps / ar_tps[model], tau=float(np.mean([r["tau"] for r in sel])),
                    tokens_per_round=sum(r["tokens"] for r in sel) / rounds,
                    all_equal_ar=all(r["tokens_equal_ar"] for r in sel))
        for k in [f"{part}_us_per_round" for part in PARTS] + ["nodes_per_round"]:
            if k in sel[0]:
                cell[k] = sum(r[k] * r["rounds"] for r in sel) / rounds
        out.append(cell)
    return out


def best(cells: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model, ``summarize``'s fixed-budget DDTree cell with the highest speed-up over AR."""
    out: dict[str, dict[str, Any]] = {}
    for c in cells:
        if c["mode"] == "ddtree" and c["speedup"] > out.get(c["model"], {"speedup": -1.0})["speedup"]:
            out[c["model"]] = c
    return out


def draw(ax: Any, cells: list[dict[str, Any]], value: str = "speedup") -> None:
    """One line per model of ``summarize``'s DDTree cells against the budget: ``speedup`` (with the 1x
    line) or ``tok_s`` (with each model's AR tokens/s dashed); a cost-aware cell is a star at its mean
    verified tree size."""
    for model in dict.fromkeys(c["model"] for c in cells):
        dd = [c for c in cells if c["model"] == model and c["mode"] == "ddtree"]
        line = ax.plot([c["budget"] for c in dd], [c[value] for c in dd], "o-", label=f"{model} DDTree")
        for c in cells:
            if c["model"] == model and c["mode"] == "ddtree_auto":
                ax.plot([c["nodes_per_round"]], [c[value]], "*", ms=12, color=line[0].get_color(),
                        label=f"{model} cost-aware")
        if value == "tok_s":
            ar = next(c for c in cells if c["model"] == model and c["mode"] == "ar")
            ax.axhline(ar["tok_s"], ls="--", color=line[0].get_color(), label=f"{model} AR")
    if value == "speedup":
        ax.axhline(1.0, color="gray", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("budget B")
    ax.set_ylabel("decode tokens/s (all prompts)" if value == "tok_s" else "DDTree / AR tokens/s")
    ax.legend(fontsize=7)


def plot(cells: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    draw(ax[0], cells, "tok_s")
    draw(ax[1], cells)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure_atomic(fig, path, dpi=110)
    plt.close(fig)


def run(out_dir: str | Path, bundles: tuple[str, ...] = BUNDLES, n_prompts: int = 64, n_tokens: int = 128,
        budgets: tuple[int, ...] = BUDGETS, wheels: str | None = None, cost_aware: bool = False,
        progress=None) -> ResultSet:
    if n_prompts < 1 or n_tokens < 2 or not budgets or min(budgets) < 1:
        raise InputError(f"bench pair wants prompts >= 1, tokens >= 2 and budgets >= 1, got {n_prompts}, "
                         f"{n_tokens}, {budgets}")
    require_gpu()
    from ..bundle import read_bundle
    from ..train.measure import humaneval_prompts
    from ..train.tokenizer import tokenizer_from_meta
    tok = tokenizer_from_meta(read_bundle(bundles[0]).meta)
    if tok is None:
        raise InputError(f"{bundles[0]} carries no tokenizer (meta.tokenizer)")
    prompts = humaneval_prompts(tok, n_prompts, wheels)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = run_metadata(bench="pair", bundles=list(bundles), prompts=f"HumanEval first {len(prompts)}",
                        new_tokens=n_tokens, budgets=list(budgets), cost_aware=cost_aware)
    rs = result_set(out, "pair", meta["git_sha"])
    rows: list[dict[str, Any]] = []
    curves: dict[str, Any] = {}
    for i, path in enumerate(bundles):
        curve = bench_bundle(path, prompts, n_tokens, budgets, rows, cost_aware, progress)
        if curve is not None:
            curves[Path(path).stem] = curve.to_dict()
            meta["cost_curves"] = curves
        mine = summarize([r for r in rows if r["model"] == Path(path).stem])
        for c in mine:
            nodes = f", {c['nodes_per_round']:.1f} nodes/round" if c["mode"] == "ddtree_auto" else ""
            print(f"[pair] {c['model']:18s} {c['mode']:11s} B={c['budget']:3d}: {c['tok_s']:8,.0f} tok/s "
                  f"({c['speedup']:4.2f}x AR), tau {c['tau']:.2f}{nodes}, equal to AR: {c['all_equal_ar']}")
        paired = {c["mode"]: c for c in mine if c["mode"] in ("ddtree_auto", "ddtree_best")}
        if len(paired) == 2:
            a, b = paired["ddtree_auto"], paired["ddtree_best"]
            print(f"[pair] {Path(path).stem:18s} cost-aware / best fixed (B = {b['budget']}), one pass: "
                  f"{a['tok_s'] / b['tok_s']:.3f}")
        cells = summarize(rows)                      # written after every bundle: a cut run keeps its data
        write_csv(rows, rs.csv)
        meta.update(summary=cells, bundles_done=list(bundles[:i + 1]), complete=i + 1 == len(bundles))
        write_json_atomic(rs.meta, meta, indent=2)
    try:
        plot(cells, rs.plot, f"DDTree vs AR, GPU engine, {meta['prompts']} x {n_tokens} tokens, "
             f"{meta.get('gpu', '')}, commit {meta['git_sha'][:7]}")
    except Exception as e:                                   # noqa: BLE001 - the CSV/JSON are the results
        print(f"plot failed: {type(e).__name__}: {e}")
    print(f"wrote {rs.csv}, {rs.meta}, {rs.plot}")
    return rs

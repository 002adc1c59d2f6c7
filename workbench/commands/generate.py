"""``python -m workbench generate BUNDLE``: greedy (or sampled) decoding of a bundle.

Backends: ``reference`` (numpy) and ``numba`` (the engine; under numba's CUDA simulator when no GPU
is present; at --temperature > 0 it samples on the host from the copied-back logits with the
reference's Generator, so both backends give the same tokens for the same --seed). Modes: ``ar``
(one token per step), ``ddtree`` (speculative, drafter dflash or oracle) and ``chain`` (the plain
DFlash chain: the same drafter, its L argmax tokens verified as one path; --budget unused). Output:
the tokens on one line, or with --json a JSON list (ar) or an object with the tokens and per-round
statistics (ddtree, chain: tree size, accepted length, depth). ``--budget auto --cost-curve FILE``:
each round verifies the prefix of the tree with the most expected tokens per microsecond
(docs/ddtree.md). The decoding itself, and the one check of the budget, is
``workbench.generate.generate``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..cli import UserError, existing_file
from . import progress


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", type=existing_file, help="path to a .kdtr bundle")
    p.add_argument("--prompt", default=None, help="comma-separated token ids (default: the bundle's prompt)")
    p.add_argument("--tokens", type=int, default=None,
                   help="tokens to generate (default: the bundle's golden length, or 24)")
    p.add_argument("--backend", choices=("reference", "numba"), default="reference",
                   help="numpy reference, or the numba engine (in the CUDA simulator without a GPU)")
    p.add_argument("--mode", choices=("ar", "ddtree", "chain"), default="ar",
                   help="ar: one token per step; ddtree: speculative, a draft tree verified per round; "
                        "chain: the plain DFlash chain, its drafted block verified as one path")
    p.add_argument("--budget", type=budget_arg, default=16,
                   help="DDTree node budget B >= 1, or auto: with --cost-curve, each round "
                        "verifies the prefix of the tree with the most expected tokens per microsecond")
    p.add_argument("--cost-curve", default=None, metavar="FILE",
                   help="the target's measured verify cost for --budget auto: a JSON curve "
                        "{rows, verify_us, round_us}, or a bench pair result set as RESULTS.json:MODEL "
                        "(default: none)")
    p.add_argument("--drafter", choices=("dflash", "oracle"), default="dflash",
                   help="DDTree's drafter: the bundle's DFlash drafter, or an oracle that knows AR's tokens")
    p.add_argument("--oracle-p", type=float, default=1.0, help="oracle drafter hit probability in [0, 1]")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; > 0 samples")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampler and the oracle drafter")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--check-ar", action="store_true",
                   help="also decode greedy AR (DDTree: on the same backend; AR on numba: on the reference) "
                        "and exit 1 with a one-line message unless the tokens are equal")
    p.add_argument("--text", default=None,
                   help="text prompt, encoded with the bundle's tokenizer; prints the decoded continuation "
                        "(default: none, token ids)")


def budget_arg(text: str) -> int | str:
    """'auto' or an int in [1, MAX_BUDGET] (the model's context is checked by workbench.generate)."""
    from ..cli import MAX_BUDGET, parse_number
    if text == "auto":
        return text
    try:
        return parse_number(text, int, 1, MAX_BUDGET)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"must be auto or an int: {e}") from None


def parse_prompt(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3]; UserError on anything else (empty items, non-integers)."""
    items = [t.strip() for t in text.split(",")]
    try:
        return [int(t, 10) for t in items]
    except ValueError:
        raise UserError(f"--prompt must be comma-separated integers like 1,2,3, got {text!r}") from None


def check_text(option: str, text: str) -> None:
    """UserError when ``text`` is not valid Unicode (invalid UTF-8 bytes in argv arrive as lone
    surrogates, which no tokenizer accepts)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UserError(f"{option} is not valid UTF-8 (bad byte at character {e.start})") from None


def use_simulator_without_gpu() -> None:
    """Select numba's CUDA simulator when no GPU is present; must run before numba.cuda is imported."""
    if "NUMBA_ENABLE_CUDASIM" in os.environ:
        return
    if "numba.cuda" in sys.modules:
        return
    try:
        import torch
        has_gpu = bool(torch.cuda.is_available())
    except ImportError:
        has_gpu = False
    if not has_gpu:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        if "numba" in sys.modules:
            from numba.core import config
            config.reload_config()


def run(args: argparse.Namespace) -> int:
    if args.tokens is not None and args.tokens < 1:
        raise UserError(f"--tokens must be >= 1, got {args.tokens}")
    if not 0.0 <= args.oracle_p <= 1.0:
        raise UserError(f"--oracle-p must lie in [0, 1], got {args.oracle_p}")
    if args.seed < 0:
        raise UserError(f"--seed must be >= 0, got {args.seed}")
    if args.check_ar and args.temperature > 0:
        raise UserError("--check-ar compares greedy tokens: use it with --temperature 0")
    prompt = parse_prompt(args.prompt) if args.prompt is not None else None
    if args.backend == "numba":
        use_simulator_without_gpu()

    from ..bundle import read_bundle
    from ..ddtree.config import SamplingParams
    from ..generate import generate

    b = read_bundle(args.bundle, model=True)
    tok, prompt = text_prompt(args, b.meta, prompt)
    weights = b.weights()
    toks = prompt if prompt is not None else [int(t) for t in b.prompt]
    n = args.tokens if args.tokens is not None else (len(b.golden) or 24)
    sampling = SamplingParams(temperature=float(args.temperature), seed=int(args.seed))
    dcfg = b.meta.get("drafter") if isinstance(b.meta, dict) else None
    progress.status(f"generate: {n} tokens, {args.mode} on the {_backend_text(args.backend)} ...")
    steps = progress.Steps(f"generate {args.mode}", unit="token")
    try:
        res = generate(b.config, weights, toks, n, backend=args.backend, mode=args.mode, drafter=args.drafter,
                       budget=args.budget, cost_curve=args.cost_curve, sampling=sampling, drafter_config=dcfg,
                       oracle_p=args.oracle_p, oracle_seed=args.seed, progress=steps)
    finally:
        steps.close()
    rounds = None
    if args.mode in ("ddtree", "chain"):
        rounds = [{"tree_size": r.tree_size, "accepted_len": r.accepted_len, "depth": r.depth}
                  for r in res.rounds]
    (_print if tok is None else _print_text(tok))(args, [int(t) for t in res.tokens], rounds)
    print(summary(args, res, n), file=sys.stderr)
    if args.check_ar:
        return check_ar(args, b.config, weights, toks, n, res.tokens)
    return 0


def _backend_text(backend: str) -> str:
    if backend == "reference":
        return "numpy reference (CPU)"
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return "numba engine in numba's CUDA simulator (CPU: for checking, not for speed)"
    return "numba engine on the GPU"


def summary(args: argparse.Namespace, res: Any, n: int) -> str:
    """One line for stderr: backend, tokens/s, and for DDTree rounds and tau (mean accepted length)."""
    line = (f"{args.mode} on the {_backend_text(args.backend)}: {n} tokens in {res.seconds:.2f} s, "
            f"{n / max(res.seconds, 1e-9):.1f} tokens/s")
    if args.mode == "ddtree":
        line += (f"; {len(res.rounds)} rounds, tau {res.mean_accepted:.2f} tokens per round "
                 f"(B = {args.budget}, drafter {args.drafter})")
    return line


def check_ar(args: argparse.Namespace, cfg: Any, weights: Any, prompt: list[int], n: int, tokens: Any) -> int:
    """Greedy AR on the same prompt: 0 and a note when ``tokens`` equal it, else 1 and a one-line error
    naming the first step that differs and AR's top-1 minus top-2 logit margin there (reference)."""
    import numpy as np

    from ..generate import generate
    from ..reference.generate import greedy_generate
    backend = args.backend if args.mode == "ddtree" else "reference"
    ar = generate(cfg, weights, prompt, n, backend=backend, mode="ar").tokens
    differ = np.flatnonzero(np.asarray(tokens) != np.asarray(ar))
    if not differ.size:
        print(f"check-ar: equal to greedy AR on the {_backend_text(backend)} over {n} tokens",
              file=sys.stderr)
        return 0
    k = int(differ[0])
    margin = float(greedy_generate(cfg, weights, prompt, k + 1).margins[k])
    print(f"error: not equal to greedy AR ({_backend_text(backend)}): first difference at step {k} "
          f"(token {int(tokens[k])}, AR {int(ar[k])}; AR's top-1 minus top-2 logit margin there "
          f"{margin:.3g})", file=sys.stderr)
    return 1


def text_prompt(args, meta: Any, prompt: list[int] | None):
    """(tokenizer, prompt ids) for --text (the bundle's meta.tokenizer encodes it), else (None, prompt)."""
    if args.text is None:
        return None, prompt
    if prompt is not None:
        raise UserError("give either --prompt or --text, not both")
    check_text("--text", args.text)
    from ..train.tokenizer import tokenizer_from_meta
    tok = tokenizer_from_meta(meta)
    if tok is None:
        raise UserError(f"{args.bundle} carries no tokenizer (meta.tokenizer); give --prompt token ids")
    ids = [int(t) for t in tok.encode(args.text)]
    if not ids:
        raise UserError("--text encodes to no tokens")
    return tok, ids


def _print_text(tok):
    """Printer of the decoded continuation: the text, or with --json {"text", "tokens", "rounds"}."""
    def show(args, tokens: list[int], rounds: list[dict] | None) -> None:
        text = tok.decode(tokens)
        if args.json:
            print(json.dumps({"text": text, "tokens": tokens, "rounds": rounds}))
        else:
            print(text)
            if rounds is not None:
                print(f"accepted lengths {[r['accepted_len'] for r in rounds]}", file=sys.stderr)
    return show


def _print(args, tokens: list[int], rounds: list[dict] | None) -> None:
    if args.json:
        if rounds is None:
            print(json.dumps(tokens))
        else:
            mean = sum(r["accepted_len"] for r in rounds) / len(rounds) if rounds else None
            print(json.dumps({"tokens": tokens, "rounds": rounds, "mean_accepted": mean}))
    else:
        print(" ".join(str(t) for t in tokens))
        if rounds is not None:
            print(f"accepted lengths {[r['accepted_len'] for r in rounds]}", file=sys.stderr)

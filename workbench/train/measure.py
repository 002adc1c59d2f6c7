"""Acceptance and drift measurements of a trained pair on the numpy reference (CPU; GPU timings apart).

Legend: P prompt length, N tree nodes (root not counted), L drafted positions, E routed experts,
k experts per token, V vocabulary.

- ``speculate``: greedy speculative decoding with the DFlash drafter, DDTree (best-first tree under a
  budget) or the plain DFlash chain (the L argmax tokens as one path), recording per round the accepted
  length, the verify size and the distinct routed experts per MoE layer of the verify forward;
- ``acceptance_sweep``: that over prompts x budgets (+ the chain), each run checked token for token
  against greedy AR;
- ``analytic_union``: E (1 - (1 - k/E)^n), the distinct experts n uniformly routed tokens touch;
- ``drift``: FP vs INT4 first greedy divergence and teacher-forced KL(FP || INT4) along the FP text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..bundle import read_bundle
from ..config import ModelConfig
from ..ddtree.chain import chain_tree
from ..ddtree.config import GREEDY, DrafterConfig, SamplingParams
from ..ddtree.dflash import DFlashDrafter
from ..ddtree.sampling import make_rng, sample_tokens
from ..ddtree.speculative import SpecState, commit, features
from ..ddtree.tree import build_tree, compile_tree
from ..ddtree.walk import walk
from ..errors import InputError
from ..reference.generate import greedy_generate
from ..reference.layers import as_array, linear, rmsnorm, weight
from ..reference.mla import mla_absorbed
from ..reference.model import ForwardOut, LatentCache
from ..reference.moe import dense_mlp, moe, moe_gate
from .tokenizer import TextTokenizer, tokenizer_from_meta

TREES = ("ddtree", "chain")


@dataclass
class Pair:
    """A bundle's target + drafter: config, float32 weights (widened once), drafter config, tokenizer."""
    cfg: ModelConfig
    weights: dict[str, np.ndarray]
    dcfg: DrafterConfig
    tok: TextTokenizer | None
    name: str


def load_pair(path: str, name: str | None = None) -> Pair:
    b = read_bundle(path)
    if not isinstance(b.meta.get("drafter"), dict):
        raise InputError(f"{path} has no drafter config (meta.drafter)")
    weights = {k: (v if k.endswith(".packed") else as_array(v, np.float32)) for k, v in b.weights().items()}
    return Pair(b.config, weights, DrafterConfig.from_dict(b.meta["drafter"]), tokenizer_from_meta(b.meta),
                name or str(path))


# ---- the verify forward with routing recorded --------------------------------------------------
def forward_routed(cfg: ModelConfig, weights: dict[str, Any], tokens: Any, cache: LatentCache,
                   positions: Any = None, visibility: np.ndarray | None = None,
                   capture: Iterable[int] = ()) -> tuple[ForwardOut, list[np.ndarray]]:
    """``reference.model.forward`` (float32, absorbed MLA) that also returns, per MoE layer, the routed
    expert ids [S, k] of its S tokens. The layer ops are the reference's own functions. Weights must be
    ndarrays (``load_pair`` widens a bundle's bfloat16 once)."""
    toks = np.asarray(tokens, dtype=np.int64)
    if toks.ndim != 1 or toks.size == 0 or toks.min() < 0 or toks.max() >= cfg.vocab_size:
        raise InputError(f"tokens must be a non-empty 1-D sequence of ids in [0, {cfg.vocab_size})")
    pos = cache.length + np.arange(toks.size) if positions is None else np.asarray(positions, dtype=np.int64)
    capture = set(capture)
    h = as_array(weight(weights, "embed")[toks], np.float32)                    # [S, M]
    hidden, routes = {}, []
    for layer in range(cfg.num_hidden_layers):
        p = f"layers.{layer}."
        h = h + mla_absorbed(cfg, weights, layer, rmsnorm(h, weights[p + "attn_norm"], cfg.rms_norm_eps), pos,
                             cache, visibility)
        x = rmsnorm(h, weights[p + "ffn_norm"], cfg.rms_norm_eps)
        if cfg.is_moe_layer(layer):
            idx, _ = moe_gate(cfg, x, weights[p + "ffn.gate"], weights[p + "ffn.gate_bias"])
            routes.append(idx)
            h = h + moe(cfg, weights, layer, x)
        else:
            h = h + dense_mlp(cfg, weights, layer, x)
        if layer in capture:
            hidden[layer] = h.copy()
    cache.length += toks.size
    logits = linear(weights, "head", rmsnorm(h, weights["norm"], cfg.rms_norm_eps))
    return ForwardOut(logits=logits, hidden=hidden), routes


# ---- speculative runs ---------------------------------------------------------------------------
@dataclass
class SpecRun:
    tokens: np.ndarray                                   # [n] generated ids
    accepted: list[int] = field(default_factory=list)    # per round: tokens committed (bonus included)
    verify_tokens: list[int] = field(default_factory=list)  # per round: root + nodes verified
    experts: list[list[int]] = field(default_factory=list)  # per round, per MoE layer: distinct experts

    @property
    def tau(self) -> float:
        return float(np.mean(self.accepted)) if self.accepted else float("nan")


def speculate(pair: Pair, prompt: Any, n_tokens: int, budget: int, tree: str = "ddtree",
              sampling: SamplingParams = GREEDY) -> SpecRun:
    """Speculative decoding of n_tokens (float32 reference) with the pair's DFlash drafter: greedy, or at
    T > 0 the lossless rule (an independent draw at every node, one seeded generator per run)."""
    if tree not in TREES:
        raise InputError(f"tree must be one of {', '.join(TREES)}, got {tree!r}")
    cfg, w = pair.cfg, pair.weights
    toks = np.asarray(prompt, dtype=np.int64)
    drafter = DFlashDrafter(cfg, w, pair.dcfg, len(toks) + n_tokens + pair.dcfg.block_size)
    cap = drafter.capture
    rng = make_rng(sampling)
    cache = LatentCache.empty(cfg, len(toks) + n_tokens + max(budget, pair.dcfg.n_drafted) + 1)
    out, _ = forward_routed(cfg, w, toks, cache, capture=cap)
    first = int(sample_tokens(out.logits[-1:], sampling, rng)[0])
    state = SpecState(cache=cache, start=len(toks), bonus=first, new_features=features(out.hidden, cap),
                      tokens=[first])
    run = SpecRun(tokens=np.zeros(0, np.int64))
    while len(state.tokens) < n_tokens:
        logits = drafter.propose(state)                                          # [L, V]
        t = build_tree(logits, budget) if tree == "ddtree" else chain_tree(logits)
        ids, positions, vis = compile_tree(t, state.bonus, state.start)
        res, routes = forward_routed(cfg, w, ids, state.cache, positions, vis, cap)
        accepted, bonus = walk(t, sample_tokens(res.logits, sampling, rng))
        commit(state, t, accepted, bonus, res.hidden, cap)
        run.accepted.append(len(accepted))
        run.verify_tokens.append(int(ids.size))
        run.experts.append([int(np.unique(r).size) for r in routes])
    run.tokens = np.asarray(state.tokens[:n_tokens], dtype=np.int64)
    return run


def acceptance_sweep(pair: Pair, prompts: list[tuple[str, np.ndarray]], n_tokens: int,
                     budgets: Iterable[int], chain: bool = True, temperature: float = 0.0, seed: int = 0,
                     progress: Any = None) -> list[dict[str, Any]]:
    """One row per (prompt, tree, budget): tau, rounds, the accepted-length histogram (index = length),
    mean verify tokens and distinct experts per MoE layer, and (greedy only; None at T > 0) whether the
    tokens equal greedy AR, and where they do not, the first step that differs and AR's top-1 minus
    top-2 logit margin there (a near-tie that float32 summation order can flip, or a real difference).
    At T > 0 each run draws with seed + prompt index."""
    rows = []
    cases = [("ddtree", int(b)) for b in budgets] + ([("chain", pair.dcfg.n_drafted)] if chain else [])
    for i, (task, ids) in enumerate(prompts):
        sampling = SamplingParams(temperature=float(temperature), seed=int(seed) + i)
        ar = greedy_generate(pair.cfg, pair.weights, ids, n_tokens) if sampling.greedy else None
        for tree, budget in cases:
            r = speculate(pair, ids, n_tokens, budget, tree, sampling)
            hist = np.bincount(r.accepted, minlength=pair.dcfg.block_size + 1)
            rows.append({"model": pair.name, "prompt": task, "prompt_tokens": int(ids.size), "tree": tree,
                         "budget": budget, "temperature": sampling.temperature, "new_tokens": n_tokens,
                         "tau": r.tau, "rounds": len(r.accepted), "accepted_hist": hist.tolist(),
                         "verify_tokens": float(np.mean(r.verify_tokens)),
                         "experts_per_layer": np.mean(r.experts, axis=0).tolist(),
                         **_against_ar(r.tokens, ar)})
            if progress is not None:
                progress.update(1)
    return rows


def _against_ar(tokens: np.ndarray, ar: Any) -> dict[str, Any]:
    """equals_ar (None without an AR run), first_diff and AR's margin there (None when equal)."""
    if ar is None:
        return {"equals_ar": None, "first_diff": None, "ar_margin_at_diff": None}
    diff = np.flatnonzero(tokens != ar.tokens)
    if diff.size == 0:
        return {"equals_ar": True, "first_diff": None, "ar_margin_at_diff": None}
    return {"equals_ar": False, "first_diff": int(diff[0]), "ar_margin_at_diff": float(ar.margins[diff[0]])}


def analytic_union(n_experts: int, k: int, n_tokens: Any) -> np.ndarray:
    """Expected distinct experts of n tokens each routed to k of E experts uniformly at random."""
    n = np.asarray(n_tokens, dtype=np.float64)
    return n_experts * (1.0 - (1.0 - k / n_experts) ** n)


# ---- FP vs INT4 drift ---------------------------------------------------------------------------
def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def drift(cfg: ModelConfig, fp: dict[str, Any], quant: dict[str, Any], prompt: Any,
          n_tokens: int) -> dict[str, Any]:
    """First greedy divergence (None: identical for all n_tokens) and, teacher-forced along the FP model's
    greedy text, KL(FP || INT4) per generated position (nats) and top-1 agreement."""
    ids = np.asarray(prompt, dtype=np.int64)
    g_fp = greedy_generate(cfg, fp, ids, n_tokens).tokens
    g_q = greedy_generate(cfg, quant, ids, n_tokens).tokens
    first = next((i for i in range(n_tokens) if g_fp[i] != g_q[i]), None)
    seq = np.concatenate([ids, g_fp[:-1]])                                       # the FP text, teacher-forced
    lp = [_log_softmax(forward_routed(cfg, w, seq, LatentCache.empty(cfg, seq.size))[0].logits[ids.size - 1:])
          for w in (fp, quant)]                                                  # [n, V] each
    kl = (np.exp(lp[0]) * (lp[0] - lp[1])).sum(-1)                               # [n]
    return {"new_tokens": n_tokens, "first_divergence": first, "kl_mean": float(kl.mean()),
            "kl_max": float(kl.max()), "kl": kl.tolist(),
            "top1_agreement": float((lp[0].argmax(-1) == lp[1].argmax(-1)).mean())}


def humaneval_prompts(tok: TextTokenizer, n: int, wheels: str | None = None) -> list[tuple[str, np.ndarray]]:
    """The first n HumanEval prompts, tokenized: (task_id, ids)."""
    from .humaneval import load_problems
    return [(p.task_id, tok.encode(p.prompt)) for p in load_problems(wheels)[:n]]


def summarize(rows: list[dict[str, Any]], n_experts: int, k: int) -> dict[str, Any]:
    """Per (temperature, tree, budget) means over prompts: tau, verify tokens, distinct experts (mean over
    MoE layers) beside the uniform-routing curve at the same verify size and their ratio, the summed
    histogram; per temperature the best budget and DDTree's best tau over the chain's."""
    groups: dict[tuple[float, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["temperature"], r["tree"], r["budget"]), []).append(r)
    cells = []
    for (temp, tree, budget), rs in sorted(groups.items()):
        verify = float(np.mean([r["verify_tokens"] for r in rs]))
        experts = float(np.mean([np.mean(r["experts_per_layer"]) for r in rs]))
        uniform = float(analytic_union(n_experts, k, verify))
        width = max(len(r["accepted_hist"]) for r in rs)
        hist = np.sum([np.pad(r["accepted_hist"], (0, width - len(r["accepted_hist"]))) for r in rs], axis=0)
        cells.append({"temperature": temp, "tree": tree, "budget": budget, "prompts": len(rs),
                      "tau": float(np.mean([r["tau"] for r in rs])), "verify_tokens": verify,
                      "experts": experts, "experts_uniform": uniform, "overlap_ratio": experts / uniform,
                      "accepted_hist": hist.tolist(),
                      "all_equal_ar": None if temp else all(r["equals_ar"] for r in rs)})
    best: dict[str, Any] = {}
    for temp in sorted({c["temperature"] for c in cells}):
        dd = [c for c in cells if c["temperature"] == temp and c["tree"] == "ddtree"]
        chain = next((c for c in cells if c["temperature"] == temp and c["tree"] == "chain"), None)
        top = max(dd, key=lambda c: c["tau"]) if dd else None
        best[f"T={temp:g}"] = {"best_budget": top and top["budget"], "best_tau": top and top["tau"],
                               "chain_tau": chain and chain["tau"],
                               "ddtree_over_chain": (top["tau"] / chain["tau"]) if top and chain else None}
    greedy = [r["equals_ar"] for r in rows if r["temperature"] == 0]
    return {"cells": cells, "best": best, "all_equal_ar": all(greedy) if greedy else None}


_WORKER: dict[str, Pair] = {}


def _init_worker(path: str, name: str) -> None:
    try:                                   # one BLAS thread per process: the processes are the parallelism
        from threadpoolctl import threadpool_limits
        threadpool_limits(1)
    except ImportError:
        pass
    _WORKER["pair"] = load_pair(path, name)


def _sweep_one(job: tuple) -> list[dict[str, Any]]:
    i, prompt, n_tokens, budgets, chain, temperature, seed = job
    return acceptance_sweep(_WORKER["pair"], [prompt], n_tokens, budgets, chain, temperature, seed + i)


def sweep(path: str, name: str, prompts: list[tuple[str, np.ndarray]], n_tokens: int, budgets: list[int],
          chain: bool = True, temperature: float = 0.0, seed: int = 0,
          workers: int = 1) -> list[dict[str, Any]]:
    """``acceptance_sweep`` of the pair in bundle ``path`` with prompts spread over ``workers`` processes
    (the same rows, in prompt order, as one process gives)."""
    if workers <= 1:
        return acceptance_sweep(load_pair(path, name), prompts, n_tokens, budgets, chain, temperature, seed)
    import concurrent.futures as cf
    import multiprocessing as mp
    jobs = [(i, p, n_tokens, list(budgets), chain, temperature, seed) for i, p in enumerate(prompts)]
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                                initargs=(path, name)) as ex:
        return [row for rows in ex.map(_sweep_one, jobs) for row in rows]

"""The engine's side of the reference scenarios (``workbench.ddtree.scenarios``): a prefill and N
greedy decode steps with every step's logits, and ONE verify of a given tree after a prefill with every
node's logits and the latent rows it appended. The K2-size checks compare these with
``decode_reference`` / ``tree_verify_reference`` on the same weights.

One layer alone (``check_layer``, what ``bench k2`` / ``bench depth`` run): ``engine_layer`` runs the
scenarios of ``ddtree.scenarios.layer_inputs`` (a P-row prefix, a decode step, a verify of a random
tree) on a ``layer.LayerRig``, ``layer_reference`` on the reference (minutes of numpy at K2 size: any
process), ``compare_layer`` compares each row's update y - x, the latent rows and the routed experts.
One MoE block alone (``check_moe_block``, what ``bench ep`` runs before its shares): the block against
``ddtree.scenarios.moe_reference`` on a few random rows, routing ties counted as the layer check does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels_numba import ops
from kernels_numba.device import download, head_rows, tail_rows

from ..ddtree.scenarios import layer_inputs, layer_reference, tree_from_parents
from ..errors import InputError
from .ar import engine_ar_generate
from .buffers import latents_f32
from .kinds import DenseKind, ExpertKind
from .runtime import Engine


@dataclass
class EngineVerify:
    logits: np.ndarray          # [N + 1, V] every node's logits under the ancestor mask
    latents: np.ndarray         # [L, N + 1, C + R] the latent rows the verify appended, per layer


def engine_decode(engine: Engine, prompt: Any, n_decode: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [n + 1], logits [n + 1, V]): the prefill's greedy token and n greedy decode steps, as
    ``decode_reference`` lays them out."""
    res = engine_ar_generate(engine, prompt, int(n_decode) + 1, return_logits=True)
    return res.tokens, res.logits


def engine_tree_verify(engine: Engine, prompt: Any, parents: Any, tokens: Any,
                       root: int | None = None) -> EngineVerify:
    """Prefill ``prompt`` (P tokens), then the engine's verify step over [root, nodes] at positions
    P + depth under the ancestor-or-self mask (root: the prefill's greedy token by default)."""
    cfg = engine.cfg
    tree = tree_from_parents(parents, tokens)
    n = tree.n_nodes
    toks = np.asarray(prompt, np.int64)
    p = toks.size
    if n + 1 > engine.buf.max_rows or p + n + 1 > engine.buf.max_len:
        raise InputError(f"a {n}-node tree after {p} prompt tokens exceeds the engine's sizes")
    if n and (tree.tokens.min() < 0 or tree.tokens.max() >= cfg.vocab_size):
        raise InputError(f"tree tokens must lie in [0, {cfg.vocab_size})")
    with ops.sim_speed():
        step = engine.verify_step(n)                         # captured before the prefill overwrites state
        engine.prefill(toks)
        if root is None:
            root = int(engine.fetch(engine.buf.amax)[p - 1])
        ctl = np.zeros(engine.buf.ctl.shape, np.int32)       # kernels_numba.tree's control block
        ctl[0, :n + 1] = np.concatenate([[root], tree.tokens])
        ctl[1, :n + 1] = np.concatenate([[0], tree.depths])
        ctl[2, :n + 1] = tree.parents
        ctl[4, :4] = (p, 0, 0, n + 1)                       # start, no previous round to compact, rows
        engine.put(engine.buf.ctl, ctl)
        step.run(engine.stream)
        logits = engine.fetch(head_rows(engine.buf.logits, n + 1))
        cache = engine.fetch(engine.buf.cache)               # [L, S, C+R]
    return EngineVerify(logits=np.array(logits), latents=latents_f32(cache[:, p:p + n + 1]))


# ---- one layer --------------------------------------------------------------------------------------
TOL = 2e-3          # relative error of each row's update y - x and of the latent rows (FP32 / W4A16)
# W16A16 (bf16 dense projections or experts): each bf16 rounding point turns the float32 sum-order noise
# before it into flips of about one bf16 step, so a chain of them ends near bf16's 2^-8. Measured on
# K2's dense layer with the reference's own exact products (a CPU): 3.9e-3; on the H200: 4.5e-3.
TOL_W16A16 = 1e-2
TIE = 1e-4          # selection-score gap under which a routing difference is a tie


def tolerance(experts: str, dense: str) -> float:
    """The check's relative tolerance for a layer held this way."""
    return TOL_W16A16 if DenseKind.BF16 in (dense, experts) else TOL


def engine_layer(cfg, seed: int, rig, prefix: int = 16, tree_nodes: int = 16) -> dict[str, Any]:
    """The scenarios of ``layer_inputs`` on ``rig`` (a ``layer.LayerRig``): the prefix's latent rows, and
    per step the output, latent rows and routes."""
    x_pre, cases = layer_inputs(cfg, seed, rig.layer, prefix, tree_nodes)
    rig.load(x_pre, 0, np.arange(prefix), np.tril(np.ones((prefix, prefix), np.uint8)))
    rig.step(prefix)
    rig.sync()
    out: dict[str, Any] = {"prefix_rows": latents_f32(download(head_rows(rig.cache, prefix))), "steps": []}
    for _, x, vis, pos in cases:
        n = x.shape[0]
        rig.load(x, prefix, pos - prefix, vis.astype(np.uint8))
        rig.step(n)
        y = rig.out(n)
        rows = latents_f32(download(head_rows(tail_rows(rig.cache, prefix), n)))
        out["steps"].append({"y": y, "rows": rows,
                             "routes": rig.routes(n) if cfg.is_moe_layer(rig.layer) else None})
    return out


def _rel(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    d = np.linalg.norm(got.astype(np.float64) - want, axis=-1)
    return d / np.maximum(np.linalg.norm(want.astype(np.float64), axis=-1), 1e-30)


def compare_routes(e: dict[str, Any], r: dict[str, Any], what: str,
                   log=print) -> tuple[np.ndarray, int, bool]:
    """(rows whose expert sets agree, ties, no difference but ties): a row whose set differs from the
    reference's is a tie when each swapped pair's reference selection scores lie within TIE (or within
    twice the row's score noise where the implementation gives its own ``scores``)."""
    n = len(r["routes"])
    keep, ties, ok = np.ones(n, bool), 0, True
    for i in range(n):
        r_set, d_set = set(r["routes"][i].tolist()), set(e["routes"][i].tolist())
        if r_set == d_set:
            continue
        keep[i] = False
        s = r["scores"][i]
        tie = max(TIE, 2 * float(np.abs(e["scores"][i] - s).max())) if "scores" in e else TIE
        if all(abs(float(s[a]) - float(s[b])) < tie for a in r_set - d_set for b in d_set - r_set):
            ties += 1
        else:
            ok = False
            log(f"  {what}: row {i} routes to {sorted(d_set)}, reference {sorted(r_set)}")
    return keep, ties, ok


def check_moe_block(cfg, seed: int, layer: int, block: ops.MoE, scratch: ops.Scratch, rows: int = 4,
                    log=print) -> dict[str, Any]:
    """A MoE block the builder made of the seeded model's ``layer`` (router, fused_moe experts, shared
    expert) against the reference's block on ``rows`` random rows: each row's relative error within TOL
    and the routed experts equal except ties; a dict with ``passed``."""
    from kernels_numba.device import to_device, zeros

    from ..ddtree.scenarios import moe_reference
    x = np.random.default_rng(seed * 7919 + layer).standard_normal((rows, cfg.hidden_size)).astype(np.float32)
    ref = moe_reference(cfg, seed, layer, x)
    h, meta = zeros((rows, cfg.hidden_size)), to_device(np.array([0, rows, 0, 0, 0, 0, 0, 0], np.int32))
    scratch.reserve(rows)
    with ops.sim_speed():
        ops.moe(h, to_device(x), block, scratch, meta, rows)
        eng = {"y": download(h), "routes": download(head_rows(scratch.rids, rows))}
    keep, ties, routes_ok = compare_routes(eng, ref, f"MoE block of layer {layer}", log)
    err = float(_rel(eng["y"][keep], ref["y"][keep]).max()) if keep.any() else 0.0
    out = {"check": f"MoE block of layer {layer} against the reference", "rows": rows, "max_rel_err": err,
           "route_ties": ties, "tol": TOL, "passed": bool(err <= TOL and routes_ok)}
    log(f"  check MoE block of layer {layer}, {rows} rows: max rel err {err:.2e}, routing ties {ties} "
        f"(tol {TOL:g}) -> {'PASS' if out['passed'] else 'FAIL'}")
    return out


def compare_layer(cfg, seed: int, layer: int, experts: str, dense: str, eng: dict[str, Any],
                  ref: dict[str, Any], prefix: int = 16, tree_nodes: int = 16, log=print,
                  tol: float | None = None) -> list[dict]:
    """One result dict per scenario with ``passed``: relative errors within ``tol`` (default
    ``tolerance(experts, dense)``); routed expert sets equal except ties (each swapped pair's reference
    selection scores within TIE, or within twice the row's score noise where the implementation gives
    its own ``scores``; such rows are left out of the error)."""
    tol = tolerance(experts, dense) if tol is None else tol
    base = {"layer": layer, "experts": str(experts), "dense": str(dense), "tol": tol}
    err = float(_rel(eng["prefix_rows"], ref["prefix_rows"]).max())
    out = [{**base, "scenario": f"prefix {prefix} rows: cache rows", "rows": prefix, "max_rel_err": err,
            "passed": err <= tol}]
    _, cases = layer_inputs(cfg, seed, layer, prefix, tree_nodes)
    for (name, x, _, _), e, r in zip(cases, eng["steps"], ref["steps"], strict=True):
        n = x.shape[0]
        upd = _rel(e["y"] - x, r["y"] - x)
        cache_err = float(_rel(e["rows"], r["rows"]).max())
        keep, ties, routes_ok = np.ones(n, bool), 0, True
        if r["routes"] is not None:
            keep, ties, routes_ok = compare_routes(e, r, f"layer {layer} {name}", log)
        worst = float(upd[keep].max()) if keep.any() else 0.0
        out.append({**base, "scenario": name, "rows": n, "max_rel_err": worst, "cache_rel_err": cache_err,
                    "route_ties": ties, "routes_match": routes_ok,
                    "passed": bool(worst <= tol and cache_err <= tol and routes_ok)})
    for r in out:
        log(f"  check layer {r['layer']} ({r['experts']} experts, {r['dense']} dense) {r['scenario']}: "
            f"max rel err {r['max_rel_err']:.2e}"
            + (f", cache rows {r['cache_rel_err']:.2e}, routing ties {r['route_ties']}"
               if "cache_rel_err" in r else "")
            + f" (tol {r['tol']:g}) -> {'PASS' if r['passed'] else 'FAIL'}")
    return out


def check_layer(cfg, seed: int, rig, prefix: int = 16, tree_nodes: int = 16, weights: Any = None,
                log=print) -> list[dict[str, Any]]:
    """Engine side, reference side and comparison in a row (the engine side under the simulator's faster
    executor) for the layer ``rig`` holds, of the seeded model ``seed`` or of ``weights``; the kinds the
    layer records choose the reference's weights and the tolerance."""
    lay = rig.lay
    experts = lay.expert_kind or ExpertKind.INT4
    with ops.sim_speed():
        eng = engine_layer(cfg, seed, rig, prefix, tree_nodes)
    ref = layer_reference(cfg, seed, rig.layer, experts, lay.dense_kind, prefix, tree_nodes, weights)
    return compare_layer(cfg, seed, rig.layer, experts, lay.dense_kind, eng, ref, prefix, tree_nodes, log)

"""``bench k2``'s check of one k2_slice layer on the device against the numpy reference layer.

Legend: P prefix rows, T rows of a step, D model width, K experts per token, E routed experts,
C + R latent row width.

Three scenarios from one seeded input stream: a P-row prefix (compared: the latent rows it appends),
a decode step and a verify of a random (N + 1)-row tree after the prefix (compared: each row's update
y - x, the latent rows and the routed experts). The two sides are apart so the reference, minutes of
numpy at K2 size, can run in another process while the device times other work: ``engine_side``
(needs the layer on the device, about a second), ``reference_side`` (any process, picklable result),
``compare``. ``check`` runs the three in a row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels_numba.device import download, head_rows, tail_rows

from ..config import ModelConfig
from ..engine.buffers import latents_f32
from ..reference.layers import sigmoid, weight
from ..reference.model import LatentCache
from ..reference.scenarios import random_tree
from .torch_layer_bench import _reference_layer, ancestor_inputs

TOL = {"int4": 2e-3, "fp32": 2e-3}  # relative error of each row's update y - x and of cache rows
# W16A16 (bf16 dense projections or experts): each bf16 rounding point turns the float32 sum-order noise
# before it into flips of about one bf16 step, so a chain of them ends near bf16's 2^-8. Measured on
# K2's dense layer with the reference's own exact products (a CPU): 3.9e-3; on the H200: 4.5e-3.
TOL_W16A16 = 1e-2
TIE = 1e-4  # selection-score gap under which a routing difference is a tie


def tolerance(experts: str, dense: str) -> float:
    """The check's relative tolerance for a layer held this way."""
    return TOL_W16A16 if dense == "bf16" or experts == "bf16" else TOL[experts]


def _inputs(cfg: ModelConfig, seed: int, layer: int, prefix: int, tree_nodes: int):
    """x of the prefix [P, D] and the two steps (name, x [T, D], vis [T, T] bool, positions [T])."""
    rng = np.random.default_rng(seed + 1000 * layer)
    x_all = rng.standard_normal((prefix + 2 + tree_nodes, cfg.hidden_size)).astype(np.float32)
    parents, _ = random_tree(cfg, tree_nodes, seed=seed + 7)
    vis_t, pos_t = ancestor_inputs(parents, prefix)
    return x_all[:prefix], [
        ("decode", x_all[prefix:prefix + 1], np.ones((1, 1), bool), np.array([prefix])),
        (f"verify {tree_nodes}-node tree + root", x_all[prefix + 1:], vis_t, pos_t),
    ]


def reference_side(cfg: ModelConfig, seed: int, layer: int, experts: str, dense: str, prefix: int = 16,
                   tree_nodes: int = 16, weights: Any = None) -> dict[str, Any]:
    """The reference layer on the check's inputs (seeded weights, W4A16; W16A16 for ``dense`` "bf16";
    ``experts`` "bf16": the bf16 layout's experts, W16A16 with bf16 outputs; or ``weights``, the layer's
    own, e.g. ``engine.build.layer_weights`` of a random stand-in layer):
    the prefix's latent rows, and per step the output y, latent rows, routes [T, K] and selection
    scores [T, E] (MoE layer). ``weights``: a weights mapping to use instead of the seeded model's."""
    from ..seeded import SeededWeights

    ref = weights if weights is not None else (                 # given weights, or the seeded model
        SeededWeights(cfg, seed, {"int4": "experts", "bf16": "bf16"}.get(experts, "fp32")))
    marked = hasattr(ref.get(f"layers.{layer}.attn.wo"), "round_input")   # W16A16 marks already on
    if (dense == "bf16" or experts == "bf16") and not marked:
        from ..quant.w16a16 import w16a16
        ref = w16a16(cfg, ref, dense=dense == "bf16", experts=experts == "bf16")
    x_pre, cases = _inputs(cfg, seed, layer, prefix, tree_nodes)
    cache = LatentCache.empty(cfg, prefix + tree_nodes + 1)
    causal = np.tril(np.ones((prefix, prefix), bool))
    _reference_layer(cfg, ref, layer, x_pre, np.arange(prefix), cache, causal)
    cache.length = prefix
    out: dict[str, Any] = {"prefix_rows": cache.layers[layer][:prefix].copy(), "steps": []}
    for _, x, vis, pos in cases:
        y, xn, routes = _reference_layer(cfg, ref, layer, x, pos, cache, vis)
        step = {"y": y, "rows": cache.layers[layer][prefix:prefix + x.shape[0]].copy(), "routes": routes}
        if routes is not None:
            p = f"layers.{layer}.ffn."
            step["scores"] = sigmoid(xn @ np.asarray(weight(ref, p + "gate"), np.float32).T) + np.asarray(
                weight(ref, p + "gate_bias"))
        out["steps"].append(step)
    return out


def engine_side(cfg: ModelConfig, seed: int, rig, prefix: int = 16, tree_nodes: int = 16) -> dict[str, Any]:
    """The same scenarios on ``rig`` (a ``k2_layer.LayerRig``): the prefix's latent rows, and per step
    the output, latent rows and routes."""
    x_pre, cases = _inputs(cfg, seed, rig.layer, prefix, tree_nodes)
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


def compare(cfg: ModelConfig, seed: int, layer: int, experts: str, dense: str, eng: dict[str, Any],
            ref: dict[str, Any], prefix: int = 16, tree_nodes: int = 16, log=print) -> list[dict[str, Any]]:
    """One result dict per scenario with ``passed``: relative errors within ``tolerance``; routed expert
    sets equal except ties (each swapped pair's reference selection scores within TIE; such rows are
    left out of the error)."""
    tol = tolerance(experts, dense)
    base = {"layer": layer, "experts": experts, "dense": dense, "tol": tol}
    err = float(_rel(eng["prefix_rows"], ref["prefix_rows"]).max())
    out = [{**base, "scenario": f"prefix {prefix} rows: cache rows", "rows": prefix, "max_rel_err": err,
            "passed": err <= tol}]
    _, cases = _inputs(cfg, seed, layer, prefix, tree_nodes)
    for (name, x, _, _), e, r in zip(cases, eng["steps"], ref["steps"], strict=True):
        n = x.shape[0]
        upd = _rel(e["y"] - x, r["y"] - x)
        cache_err = float(_rel(e["rows"], r["rows"]).max())
        keep, ties, routes_ok = np.ones(n, bool), 0, True
        if r["routes"] is not None:
            for i in range(n):
                r_set, d_set = set(r["routes"][i].tolist()), set(e["routes"][i].tolist())
                if r_set == d_set:
                    continue
                keep[i] = False
                s = r["scores"][i]
                if all(abs(float(s[a]) - float(s[b])) < TIE for a in r_set - d_set for b in d_set - r_set):
                    ties += 1
                else:
                    routes_ok = False
                    log(f"  layer {layer} {name}: row {i} routes to {sorted(d_set)}, "
                        f"reference {sorted(r_set)}")
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


def check(cfg: ModelConfig, seed: int, rig, experts: str = "int4", prefix: int = 16, tree_nodes: int = 16,
          log=print) -> list[dict[str, Any]]:
    """Engine side, reference side and comparison in a row (under the simulator's faster executor)."""
    from kernels_numba import ops

    with ops.sim_speed():
        eng = engine_side(cfg, seed, rig, prefix, tree_nodes)
    ref = reference_side(cfg, seed, rig.layer, experts, rig.lay.dense_kind, prefix, tree_nodes)
    return compare(cfg, seed, rig.layer, experts, rig.lay.dense_kind, eng, ref, prefix, tree_nodes, log)

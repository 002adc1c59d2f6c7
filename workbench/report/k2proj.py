"""Full-K2 decode and DDTree speed projected from the measured k2_slice layers and a tau(B) curve.

MEASURED inputs: the engine's whole-layer time (``part = layer``) of the dense layer and of a MoE
layer with INT4 experts routed by its own router, at 1 row (decode) and B + 1 rows (verify of a
B-node tree plus its root), from the current ``bench k2`` result set (``k2_layer_<commit>``); tau(B),
tokens per round, from a DDTree run. PROJECTED: one K2 step = ``first_k_dense_replace`` dense layers
+ the rest MoE layers, each at the measured time of its kind; AR tokens/s = 1 / decode step, DDTree
tokens/s = tau(B) / verify step. Left out: embedding, final norm and the lm_head (163,840 x 7,168),
the drafter's forward, tree building and the host loop, and that the 61 layers (about 595 GB in
INT4) do not fit one H200: it is one GPU's bandwidth applied to the whole model, not a run.

With ``overlap`` (per budget, distinct experts a real tree touched over the uniform-routing count at the
same verify size, from a trained pair) the MoE layer's routed-experts part (``part = routed_experts``,
the router's routing) is scaled by that ratio: the k2_slice's seeded router spreads a tree's tokens like
uniform routing, a trained router shares experts between them. That carries a ratio measured at the
pair's E and k over to K2's: a projection.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..bench.results import current_set
from ..config import ModelConfig
from .benchdata import read_csv


def load_layers(bench_dir: str | Path,
                dense: str | None = None) -> tuple[dict[str, dict[int, float]], dict[str, Any]] | None:
    """({"dense": {rows: us}, "moe": {rows: us}, "experts": {rows: us}}, the set's metadata) of the current
    k2_layer set, or None; "experts" is the MoE layer's routed-experts part under its router's routing.
    ``dense``: which way of holding the dense projections to read ("fp32" or "bf16", bench k2's
    ``--dense``; rows of sets from before that option are "fp32"); default "bf16" where the set has
    it (K2-Thinking's layout), else "fp32". The metadata's ``dense_used`` says which."""
    rs = current_set(bench_dir, "k2_layer")
    if rs is None:
        return None
    rows = read_csv(rs.csv)
    kinds = {r.get("dense") or "fp32" for r in rows}
    use = dense or ("bf16" if "bf16" in kinds else "fp32")
    times: dict[str, dict[int, float]] = {"dense": {}, "moe": {}, "experts": {}}
    for r in rows:
        if r["impl"] != "numba engine" or r["experts"] != "int4" or (r.get("dense") or "fp32") != use:
            continue
        kind = None
        if r["part"] == "layer":
            kind = "dense" if r["routing"] == "-" else "moe" if r["routing"] == "router" else None
        elif r["part"] == "routed_experts" and r["routing"] == "router":
            kind = "experts"
        if kind is not None:
            times[kind].setdefault(int(r["rows"]), float(r["us"]))       # the first MoE layer measured
    return times, {**rs.read_meta(), "dense_used": use}


def project(cfg: ModelConfig, times: dict[str, dict[int, float]], tau: dict[int, float],
            overlap: dict[int, float] | None = None) -> list[dict[str, Any]]:
    """One row per budget B whose B + 1 rows were measured (B = 0: AR decode, tau 1): the projected
    step time of the whole model, tokens/s and the speed-up over AR; with ``overlap`` {B: ratio} the
    MoE layers' routed-experts part at B + 1 rows scaled by the ratio (budgets without one are left out)."""
    dense, moe = cfg.first_k_dense_replace, cfg.num_hidden_layers - cfg.first_k_dense_replace

    def step_us(rows: int) -> float:
        moe_us = times["moe"][rows]
        if overlap is not None and rows > 1:
            moe_us -= (1.0 - overlap[rows - 1]) * times["experts"][rows]
        return dense * times["dense"][rows] + moe * moe_us

    ar_us = step_us(1)
    out = [{"budget": 0, "rows": 1, "tau": 1.0, "step_ms": ar_us / 1e3, "tok_s": 1e6 / ar_us, "speedup": 1.0}]
    for b in sorted(tau):
        rows = b + 1
        have = rows in times["dense"] and rows in times["moe"]
        if overlap is not None:
            have = have and b in overlap and rows in times.get("experts", {})
        if have:
            us = step_us(rows)
            out.append({"budget": b, "rows": rows, "tau": tau[b], "step_ms": us / 1e3,
                        "tok_s": tau[b] * 1e6 / us, "speedup": tau[b] * ar_us / us})
    return out

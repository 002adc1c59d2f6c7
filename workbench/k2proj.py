"""Full-K2 decode and DDTree speed projected from the measured k2_slice layers and a tau(B) curve.

MEASURED inputs: the engine's whole-layer time (``part = layer``) of the dense layer and of a MoE
layer with INT4 experts routed by its own router, at 1 row (decode) and B + 1 rows (verify of a
B-node tree plus its root), from the current ``bench k2`` result set (``k2_layer_<commit>``); tau(B),
tokens per round, from a DDTree run. PROJECTED: one K2 step = ``first_k_dense_replace`` dense layers
+ the rest MoE layers, each at the measured time of its kind; AR tokens/s = 1 / decode step, DDTree
tokens/s = tau(B) / verify step; the step's once-per-step attention rows (``part = step_rows``) are
added once. Left out unless given as
``terms`` (measured by ``bench depth``): embedding, final norm and the lm_head (163,840 x 7,168), the
drafter's forward, tree building and the host loop; and the 61 layers (about 595 GB in INT4) do not fit
one H200: it is one GPU's bandwidth applied to the whole model, not a run. ``bench depth`` runs a 61-layer
stand-in with random weights instead (``depth_side_by_side``: its projection from its own parts beside
its measured per-token times).

With ``overlap`` (per budget, distinct experts a real tree touched over the uniform-routing count at the
same verify size, from a trained pair) the MoE layer's routed-experts part (``part = routed_experts``,
the router's routing) is scaled by that ratio: the k2_slice's seeded router spreads a tree's tokens like
uniform routing, a trained router shares experts between them. That carries a ratio measured at the
pair's E and k over to K2's: a projection.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from .config import ModelConfig
from .results import cell, current_set, read_csv


def load_layers(bench_dir: str | Path,
                dense: str | None = None) -> tuple[dict[str, dict[int, float]], dict[str, Any]] | None:
    """({"dense": {rows: us}, "moe": {rows: us}, "experts": {rows: us}, "random": {rows: us},
    "random_unique": {rows: distinct experts}, "step": {rows: us}}, the set's metadata) of the current
    k2_layer set, or None; "experts" is the MoE layer's routed-experts part under its router's routing,
    "random" the same part under random routing sets, with the median distinct experts they touched;
    "step" what a step computes once for all its layers (``part = step_rows``; empty in sets from before
    the layers shared it, whose layer times hold it).
    ``dense``: which way of holding the dense projections to read ("fp32" or "bf16", bench k2's
    ``--dense``; rows of sets from before that option are "fp32"); default "bf16" where the set has
    it (K2-Thinking's layout), else "fp32". The metadata's ``dense_used`` says which."""
    rs = current_set(bench_dir, "k2_layer")
    if rs is None:
        return None
    rows = read_csv(rs.csv)
    kinds = {r.get("dense") or "fp32" for r in rows}
    use = dense or ("bf16" if "bf16" in kinds else "fp32")
    kinds_out = ("dense", "moe", "experts", "random", "random_unique", "step")
    times: dict[str, dict[int, float]] = {k: {} for k in kinds_out}
    for r in rows:
        if r["impl"] != "numba engine" or r["experts"] != "int4" or (r.get("dense") or "fp32") != use:
            continue
        kind = None
        if r["part"] == "layer":
            kind = "dense" if r["routing"] == "-" else "moe" if r["routing"] == "router" else None
        elif r["part"] == "routed_experts":
            kind = {"router": "experts", "random": "random"}.get(r["routing"])
        elif r["part"] == "step_rows":
            kind = "step"
        if kind is not None:
            times[kind].setdefault(int(r["rows"]), float(r["us"]))       # the first MoE layer measured
            if kind == "random":
                times["random_unique"].setdefault(int(r["rows"]), float(r["unique_experts"]))
    return times, {**rs.read_meta(), "dense_used": use}


def project(cfg: ModelConfig, times: dict[str, dict[int, float]], tau: dict[int, float],
            overlap: dict[int, float] | None = None,
            terms: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per budget B whose B + 1 rows were measured (B = 0: AR decode, tau 1): the projected
    step time of the whole model, tokens/s and the speed-up over AR; with ``overlap`` {B: ratio} the
    MoE layers' routed-experts part at B + 1 rows scaled by the ratio (budgets without one are left out).
    ``terms`` adds what the layers leave out, each measured: "embed", "head" (final norm + lm_head +
    argmax) and "tree" (a verify's KV compaction + tree compile) as {rows: us}; "drafter" (us per round,
    verify steps only); "host" {B: us per round} (tree build, walk and commit on the host; B = 0: AR)."""
    dense, moe = cfg.first_k_dense_replace, cfg.num_hidden_layers - cfg.first_k_dense_replace
    terms = terms or {}

    def extra(rows: int) -> float:
        us = sum(terms.get(k, {}).get(rows, 0.0) for k in ("embed", "head", "tree"))
        us += terms.get("host", {}).get(rows - 1, 0.0)
        return us + (terms.get("drafter", 0.0) if rows > 1 else 0.0)

    def step_us(rows: int) -> float:
        moe_us = times["moe"][rows]
        if overlap is not None and rows > 1:
            moe_us -= (1.0 - overlap[rows - 1]) * times["experts"][rows]
        layers = dense * times["dense"][rows] + moe * moe_us
        return times.get("step", {}).get(rows, 0.0) + layers + extra(rows)

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


@functools.cache                      # the same counts for every drafter's projection
def busiest_gpu_experts(n_experts: int, k: int, rows: int, world: int, trials: int = 400,
                        seed: int = 0) -> float:
    """Mean over random routings of the most distinct experts one of ``world`` GPUs holds among those
    ``rows`` tokens touch (each token k of E uniformly; GPU g holds experts [g E/w, (g+1) E/w))."""
    rng = np.random.default_rng(seed)
    total, chunk = 0.0, 50
    for start in range(0, trials, chunk):
        m = min(chunk, trials - start)
        picks = np.argpartition(rng.random((m, rows, n_experts)), k, axis=-1)[..., :k]   # [m, rows, k]
        touched = np.zeros((m, n_experts), bool)
        np.put_along_axis(touched, picks.reshape(m, -1), True, axis=-1)                 # [m, E]
        total += touched.reshape(m, world, n_experts // world).sum(axis=-1).max(axis=-1).sum()
    return total / trials


def experts_us(times: dict[str, dict[int, float]], u: float) -> float:
    """Routed-experts time for ``u`` distinct experts on one GPU: the measured random-routing points
    (distinct experts, us) interpolated linearly, and extended along the first / last two points."""
    pts = sorted((times["random_unique"][n], times["random"][n]) for n in times["random"])
    us, ts = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    if u < us[0] or u > us[-1]:
        i = 0 if u < us[0] else len(us) - 2
        return float(ts[i] + (u - us[i]) * (ts[i + 1] - ts[i]) / (us[i + 1] - us[i]))
    return float(np.interp(u, us, ts))


def load_ep(bench_dir: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """(rows, metadata) of the current ``bench ep`` set, or None; every row names the run that measured it
    (``run``: a merged set's column, else the set's own commit)."""
    rs = current_set(bench_dir, "ep_moe")
    if rs is None:
        return None
    rows, meta = read_csv(rs.csv), rs.read_meta()
    for r in rows:
        r["run"] = r.get("run") or meta.get("git_sha", "?")
    return rows, meta


def ep_local(rows: list[dict[str, Any]], world: int) -> dict[int, float]:
    """{T: us} of a ``bench ep`` set's ranks-in-turn rows at P = ``world``: the busiest rank's local
    MoE (its share of the routed experts, timed on one GPU); empty where the set has none."""
    return {int(r["rows"]): float(r["us"]) for r in rows
            if r["impl"] == "ranks in turn" and int(r["world"]) == world}


def project_ep(cfg: ModelConfig, times: dict[str, dict[int, float]], tau: dict[int, float],
               world: int = 8, local: dict[int, float] | None = None) -> list[dict[str, Any]]:
    """``project`` for one GPU of ``world``-way expert parallelism: each GPU holds E / world experts of
    every layer and runs the rest of the layer itself (batch 1: every GPU computes the same attention).
    A MoE layer at n rows costs its measured time less its routed-experts part, plus the busiest GPU's
    share of the experts: ``local`` {rows: us} where given (``ep_local``: measured, ranks in turn
    on one GPU; rows it lacks are left out), else ``experts_us`` of the busiest GPU's expected distinct
    experts (``busiest_gpu_experts``, uniform routing). Left out besides ``project``'s: the all-to-all
    that sends each token's rows to its experts' GPUs and back (two per MoE layer)."""
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    rows_all = sorted(n for n in times["moe"] if n in times["experts"] and n in times["dense"]
                      and (local is None or n in local))
    share = (lambda n: local[n]) if local is not None else \
        (lambda n: experts_us(times, busiest_gpu_experts(e, k, n, world)))
    moe_ep = {n: times["moe"][n] - times["experts"][n] + share(n) for n in rows_all}
    return project(cfg, {"dense": times["dense"], "moe": moe_ep, "step": times.get("step", {})}, tau)


def best_budgets(rows: list[dict[str, Any]], key: str = "drafter") -> str:
    """Markdown of each ``key`` group's best projected budget (``project`` rows with a ``key`` column):
    its speed-up over AR, tokens/s and the AR tokens/s."""
    groups = dict.fromkeys(r[key] for r in rows)
    best = [max((r for r in rows if r[key] == g), key=lambda r: r["speedup"]) for g in groups]
    ar = {r[key]: r["tok_s"] for r in rows if r["budget"] == 0}
    return "; ".join(f"{r[key]}: **{r['speedup']:.2f}×** AR at B = {r['budget']} ({r['tok_s']:.0f} tok/s, "
                     f"AR {ar[r[key]]:.0f})" for r in best)


# ---- bench depth: the projection from the stand-in's own parts beside its measured runs --------------

def depth_parts(rows: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """{part: {rows: us}} of a ``k2_depth`` set's part rows ("embed", "head", "tree", "drafter",
    "dense.layer", "moe.attention", ...)."""
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        if r.get("table") == "part" and _num(r.get("us")):
            out.setdefault(str(r["part"]), {})[int(r["rows"])] = float(r["us"])
            for key, name in (("unique_experts", "unique"), ("expert_reads", "reads")):
                if _num(r.get(key)):
                    out.setdefault(f"{r['part']}.{name}", {})[int(r["rows"])] = float(r[key])
    return out


def project_depth(cfg: ModelConfig, parts: dict[str, dict[int, float]],
                  runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per measured run (AR and every DDTree source and budget): ``project`` from the stand-in's own parts
    (its dense and MoE layer times, the step's rows, embedding, lm_head, tree compile, the drafter's
    round; the routed experts scaled by the expert reads the run's verifies made over those of the
    part's random rows, ``experts_scale``: tiles of 8 pairs on the tiled path, distinct experts below it
    or in sets that recorded only those) and the run's measured host phases (tree build, walk and
    commit) and its draft phase beyond the drafter's graph (``topk_us_per_round``: the top-k over the
    vocabulary, its copy back and sync), at the run's tau; beside it the measured ms per token, their
    ratio, and the named rest: ``gap_ms_per_round``, the measured round less the projected one (the
    verify's copy back, synchronisations and graph launches, as measured)."""
    times = {"dense": parts["dense.layer"], "moe": parts["moe.layer"], "step": parts.get("moe.step_rows", {}),
             "experts": parts.get("moe.routed_experts", {})}
    unique = parts.get("moe.routed_experts.unique", {})
    reads = parts.get("moe.routed_experts.reads", {})
    out = []
    for r in runs:
        b = int(r["budget"])
        if b + 1 not in times["moe"]:
            continue
        host = 0.0
        if b:
            host = (_num(r.get("build_us_per_round")) + _num(r.get("walk_us_per_round"))) if \
                _has(r.get("build_us_per_round")) else _host_of(runs, b)
        drafter = next(iter(parts.get("drafter", {}).values()), 0.0)
        topk = 0.0                # the draft phase beyond the drafter's graph: top-k, its copy back, the sync
        if b:
            draft = _num(r.get("draft_ms_per_round")) * 1e3 if _has(r.get("draft_ms_per_round")) \
                else _mean_of(runs, b, "draft_ms_per_round") * 1e3
            topk = max(draft - drafter, 0.0) if draft else 0.0
        terms = {"embed": parts.get("embed", {}), "head": parts.get("head", {}),
                 "tree": parts.get("tree", {}), "drafter": drafter, "host": {b: host + topk}}
        tau = float(r["tau"])
        # the routed experts at the expert reads the loop's verifies made, not the parts' (random rows):
        # the count fused_moe's path reads weights by where both sides give it, else distinct experts
        read = _num(r.get("expert_reads")) or _mean_of(runs, b, "expert_reads")
        seen = _num(r.get("distinct_experts")) or _mean_of(runs, b, "distinct_experts")
        overlap = None
        if b and read and reads.get(b + 1):
            overlap = {b: read / reads[b + 1]}
        elif b and seen and unique.get(b + 1):
            overlap = {b: seen / unique[b + 1]}
        row = project(cfg, times, {b: tau} if b else {}, overlap=overlap, terms=terms)[-1]
        proj_round = row["step_ms"]
        proj_tok = proj_round / tau
        meas_tok = float(r["ms_per_token"])
        out.append({"source": r["source"], "budget": b, "tau": tau, "measured_ms_per_token": meas_tok,
                    "projected_ms_per_token": proj_tok, "ratio": meas_tok / proj_tok,
                    "projected_round_ms": proj_round, "host_us_per_round": host, "topk_us_per_round": topk,
                    "drafter_us_per_round": drafter if b else 0.0,
                    "experts_scale": overlap[b] if overlap else 1.0,
                    "gap_ms_per_round": (meas_tok - proj_tok) * tau})
    return out


def _has(v: Any) -> bool:
    """A cell that holds a number (not missing, empty or NaN)."""
    return v is not None and v != "" and v == v


def _num(v: Any) -> float:
    """A cell as a float: 0 for a missing or NaN one."""
    if v is None or v == "" or v != v:
        return 0.0
    return float(v)


def _mean_of(runs: list[dict[str, Any]], b: int, key: str) -> float:
    vals = [_num(r.get(key)) for r in runs if int(r["budget"]) == b and _has(r.get(key))]
    return float(np.mean(vals)) if vals else 0.0


def _host_of(runs: list[dict[str, Any]], b: int) -> float:
    """The mean measured host phases per round of the oracle runs at budget b (for replayed sources)."""
    hs = [_num(r.get("build_us_per_round")) + _num(r.get("walk_us_per_round")) for r in runs
          if int(r["budget"]) == b and _has(r.get("build_us_per_round"))]
    return float(np.mean(hs)) if hs else 0.0


def depth_side_by_side(bench_dir: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """(``project_depth`` rows of the current ``k2_depth`` set, its metadata), or None without one: for the
    notebooks, the projection and the measurement side by side."""
    from .config import preset
    rs = current_set(bench_dir, "k2_depth")
    if rs is None:
        return None
    rows = [{k: cell(v) for k, v in r.items()} for r in read_csv(rs.csv)]    # empty cells: None
    runs = [r for r in rows if r.get("table") == "run"]
    return project_depth(preset("k2_6"), depth_parts(rows), runs), rs.read_meta()

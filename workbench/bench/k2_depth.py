"""``bench depth``: the workbench's answer at K2 depth, measured on one GPU with a stand-in model.

Legend: P prompt tokens, n new tokens, B budget (tree nodes; a verify runs B + 1 rows), p oracle
accuracy, tau tokens per round, S distinct MoE weight sets.

The stand-in (``engine.build.RandomSource``, built by ``engine.build.build_model``): Kimi-K2.6's 61 layers
at the ``k2_6`` dimensions, K2's layout (the dense layer and 60 MoE layers with 384 routed experts INT4
G = 32 on fused_moe, attention / shared expert / dense MLP / lm_head bf16 W16A16, router float32), the
embedding and final norm, run by the engine's own loop, graphs and kernels (``engine.runtime.Engine``
with ``model=``). RANDOM WEIGHTS, NOT K2'S: K2.6 in INT4 (~595 GB) does not fit one H200, so the 60 MoE
positions cycle over S distinct weight sets (as many as fit, at least 8; each ~9.8 GB, far beyond the L2,
so every position reads its weights from HBM as 60 distinct layers would), each position with its own
latent cache rows. Its tokens mean nothing and its routing is near uniform (the worst case for a tree's
distinct experts).

What runs, in one process:
1. checks: the dense layer and the first MoE layer against the numpy reference on their own weights,
   downloaded (``engine.build.layer_weights``; ``k2_check``'s scenarios, the reference in a child
   process while the device times); every DDTree run's greedy tokens equal to AR's.
2. AR over n + L tokens after a random P-token prompt (``engine.ar.engine_ar_generate``): ms per token.
3. the parts, each a captured CUDA graph timed as ``bench k2`` times them (spin kernel ahead, 256 MiB
   written before each replay): the embedding, the step's attention rows, the dense layer and a MoE
   layer split into attention / router / routed experts (their own routing) / shared expert / rest, the
   final norm + lm_head + argmax, the verify's KV compaction + tree compile, the drafter's round.
4. DDTree at each budget B with the oracle drafter at each p (``workbench.ddtree.oracle``: the target's
   true token on top with probability p; the true continuation is the AR run's) through the engine's
   round methods (``engine.rounds.EngineSpecState``: draft, build_tree, verify, walk, commit), with the
   drafter's forward (random bf16 weights, its proposals unused) run every round before the draft
   (its prompt pass before the rounds, as the target's prefill); per round the wall time of each phase,
   and for the first rounds the distinct experts each MoE layer of the verify touched and the expert
   tiles they make (``ops.expert_tiles``: the tiled MoE path's weight reads), averaged over the
   layers; per run the mean E(N) the draft states for its trees beside the tau it got, and the oracle's
   hit rate as drawn at the drafted positions (``oracle.hit_rate``: the acceptance each p gives this
   seed).
5. the trained code pair's acceptance replayed: tau(B) = its tokens / rounds over the HumanEval prompts of
   the current ``pair`` set (model ``code``, the BF16 pair's measured DDTree runs), times this stand-in's
   measured round time at B (the mean over the oracle runs at B: a round's time does not depend on
   what is accepted) -> ms per token.
6. the projection (``k2proj.project_depth``) from the parts beside each measured run.
``--dry-run`` runs the same code at a tiny config in the CUDA simulator (no timing), for CI.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import statistics
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ..ddtree.oracle import KINDS as ORACLE_KINDS

BUDGETS = (1, 2, 4, 8, 16, 32, 64)
ORACLE_P = (0.8, 0.5, 0.9, 0.7)            # run in this order: the most telling first
FIRST_BUDGETS = 8                          # every p's budgets up to this run before any larger one
TAPS = (1, 12, 24, 35, 47, 58)             # Kimi-K2.6-DFlash's target_layer_ids
BLOCK = 8                                  # its block size
MIN_SETS = 8
LABEL = "K2.6-shape stand-in with random weights (not K2's weights)"
PART_ROWS = (1, 2, 3, 5, 9, 17, 33, 65)


def add_arguments(parser) -> None:
    """``bench depth``'s flags; on a parser that already has some of them (``bench``'s shared flags:
    --out, --reps, --tokens, --budgets, --no-check, --dry-run) those are left as they are."""
    have = {s for a in parser._actions for s in a.option_strings}

    def opt(name: str, **kw) -> None:
        if name not in have:
            parser.add_argument(name, **kw)
    opt("--out", default="reports/bench", help="output folder (default reports/bench)")
    opt("--sets", type=int, default=0, help=f"depth: distinct MoE weight sets (0: as many as fit, at least "
                                            f"{MIN_SETS})")
    opt("--prompt", type=int, default=512, help="depth: prompt tokens (random ids)")
    opt("--tokens", type=int, default=128, help="new tokens per run")
    opt("--budgets", default=None, help="DDTree budgets (default 1,2,4,...,64)")
    opt("--oracle-p", default=",".join(map(str, ORACLE_P)), help="depth: oracle accuracies")
    opt("--reps", type=int, default=20, help="graph replays per part")
    opt("--seed", type=int, default=0, help="depth: weights, prompt and oracle seed")
    opt("--deadline", type=float, default=470.0,
        help="depth: seconds after the start past which no new run starts")
    opt("--no-check", action="store_true", help="leave out the layer checks")
    opt("--oracle", choices=ORACLE_KINDS, default="calibrated",
        help="depth: the oracle's top token at probability p (calibrated: the draft's probabilities say "
             "how often it is right, as a trained drafter's and as the cost-aware budget assumes) or "
             "MARGIN logits above the rest (margin)")
    opt("--drafter", choices=("engine", "none"), default="engine",
        help="depth: run the DFlash-shape drafter's forward every round (engine) or not")
    opt("--dry-run", action="store_true",
        help="depth: the whole code path at a tiny config under the CUDA simulator (no timing)")


def _floats(flag: str, text: str, kind=float) -> tuple:
    from ..errors import InputError
    try:
        return tuple(kind(v) for v in text.split(","))
    except ValueError:
        raise InputError(f"--{flag} wants comma-separated numbers, got {text!r}") from None


def run_set(args, progress=None):
    """The benchmark for parsed ``args``; its result set (``progress``: as ``bench``'s)."""
    from ..errors import InputError
    budgets = _floats("budgets", args.budgets, int) if args.budgets else BUDGETS
    ps = _floats("oracle-p", args.oracle_p)
    if any(b < 1 for b in budgets) or any(not 0 <= p <= 1 for p in ps) or args.tokens < 2 or args.prompt < 1:
        raise InputError("budgets >= 1, oracle p in [0, 1], --tokens >= 2 and --prompt >= 1")
    return bench(Path(args.out), sets=args.sets, prompt_len=args.prompt, n_tokens=args.tokens,
                 budgets=budgets, ps=ps, reps=args.reps, seed=args.seed, deadline_s=args.deadline,
                 check=not args.no_check, drafter=args.drafter, oracle=args.oracle, dry_run=args.dry_run,
                 progress=progress)


def run(args, progress=None) -> int:
    """The command: 0 when every check passed, 1 otherwise."""
    return 0 if run_set(args, progress).read_meta().get("checks_passed") else 1


# ---- configuration ------------------------------------------------------------------------------------

def run_order(ps, budgets) -> list[tuple[float, int]]:
    """The fixed-budget runs, (p, B), in the order a deadline cuts last-first: every p's budgets up to
    FIRST_BUDGETS (where a tree paid off, if anywhere) in ``ps``'s order, then every p's larger ones,
    whose time the projection gives within a few percent (docs/k2-depth.md). The cost-aware runs come
    after them all, over each p's measured curve."""
    first = [(p, b) for p in ps for b in budgets if b <= FIRST_BUDGETS]
    return first + [(p, b) for p in ps for b in budgets if b > FIRST_BUDGETS]


def _config(dry_run: bool):
    from ..config import preset
    if not dry_run:
        return preset("k2_6"), TAPS
    cfg = dataclasses.replace(preset("tiny2"), moe_intermediate_size=64, num_hidden_layers=5,
                              first_k_dense_replace=1)
    return cfg, (1, 3)


def set_bytes(cfg) -> int:
    """Device bytes of one distinct MoE layer of the stand-in (INT4 experts with f16 scales, bf16
    attention and shared expert, float32 router)."""
    from .k2_build import layer_bytes
    lb = layer_bytes(cfg, cfg.first_k_dense_replace)
    return (cfg.n_routed_experts * lb["expert_int4"] + 2 * (lb["attention_params"] + lb["shared_params"])
            + 4 * lb["router_params"])


def choose_sets(cfg, free_bytes: int, reserve_bytes: int, want: int = 0) -> int:
    """Distinct MoE weight sets: ``want`` if given, else as many as fit in ``free_bytes`` less
    ``reserve_bytes`` (at most the MoE layer count); InputError below MIN_SETS."""
    from ..errors import InputError
    fit = int((free_bytes - reserve_bytes) // set_bytes(cfg))
    n = min(want or fit, cfg.num_hidden_layers - cfg.first_k_dense_replace)
    if n > fit:
        raise InputError(f"{n} weight sets do not fit ({fit} do)")
    return n


# ---- timing -------------------------------------------------------------------------------------------

class Timer:
    """GPU time of a launch sequence ``fn(stream)``: captured in a CUDA graph, replayed ``reps`` times
    behind a spin kernel with a 256 MiB write before each replay (weights from HBM), median in us. Under
    the simulator it runs ``fn`` once eagerly and returns NaN (the code path, no time)."""

    def __init__(self, gpu: bool, reps: int) -> None:
        self.gpu, self.reps = gpu, reps
        if gpu:
            import torch
            self.flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def __call__(self, fn, before=None) -> float:
        if not self.gpu:
            fn(0)
            return float("nan")
        from ..engine.graphs import StepGraph
        from .common import spin_timed
        g = StepGraph(fn, True)

        def pre(r: int) -> None:
            if before is not None:
                before(r)
            self.flush.zero_()
        return float(statistics.median(spin_timed(lambda: g.run(None), self.reps, before=pre)))


def expert_load(ids: np.ndarray) -> dict[str, float]:
    """What a MoE layer's routing ids [T, K] make its routed experts read: the distinct experts, their
    tiles of 8 pairs (``ops.expert_tiles``), and ``expert_reads``, the count fused_moe's path at T rows
    reads weights by (per distinct expert up to ``ops.GEMV_TOKENS`` rows, where an expert's other pairs
    mostly hit the L2; per tile above)."""
    from kernels_numba import ops
    unique, tiles = len(np.unique(ids)), ops.expert_tiles(ids)
    return {"unique_experts": float(unique), "expert_tiles": float(tiles),
            "expert_reads": float(tiles if len(ids) > ops.GEMV_TOKENS else unique)}


def layers_load(routes: list[np.ndarray]) -> dict[str, float]:
    """``expert_load`` per MoE layer, averaged over the layers (the projection's routed experts are a sum
    over them); ``last_layer_experts``: the last one's distinct experts."""
    loads = [expert_load(ids) for ids in routes]
    return {**{k: float(np.mean([ld[k] for ld in loads])) for k in loads[0]},
            "last_layer_experts": loads[-1]["unique_experts"]}


def verify_routing(engine, rows: int, live: int) -> list[np.ndarray]:
    """Every MoE layer's routing ids [live, K] in the verify just run: its forward again over the same
    ``rows`` grid rows, eagerly (it rewrites the same latent rows and outputs), each MoE layer's ids
    copied out after its launch."""
    from kernels_numba.device import head_rows

    from ..engine.model import launch_forward
    routes: list[np.ndarray] = []

    def grab(i: int) -> None:
        if engine.model.layers[i].moe is not None:
            routes.append(engine.fetch(head_rows(engine.scratch.rids, live)))

    launch_forward(engine, rows, engine.stream, engine.taps, after_layer=grab)
    engine.sync()
    return routes


def time_layer_parts(cfg, model, context: int, rows_list, timer: Timer, emit, seed: int = 0) -> None:
    """The dense layer and the first MoE layer per part (``k2_layer.LayerRig.parts``, the router's own
    routing) at each row count, after ``context`` cached random latent rows; "rest" = layer - parts."""
    from kernels_numba.device import default_stream, head_rows, kernel_array, upload

    from ..ddtree.scenarios import ancestor_inputs, random_tree
    from ..engine.buffers import latents_for
    from ..engine.layer import LayerRig
    rng = np.random.default_rng(seed)
    for layer in (0, cfg.first_k_dense_replace):
        kind = "moe" if cfg.is_moe_layer(layer) else "dense"
        rig = LayerRig(cfg, layer, model.layers[layer], max(rows_list), context + max(rows_list))
        rows = rng.standard_normal((context, cfg.kv_cache_dim))
        upload(head_rows(rig.cache, context), latents_for(kernel_array(rig.cache), rows))
        for n in rows_list:
            parents, _ = random_tree(cfg, n - 1, seed=n)
            vis, pos = ancestor_inputs(parents, context)
            rig.load(rng.standard_normal((n, cfg.hidden_size)).astype(np.float32), context, pos - context,
                     vis.astype(np.uint8))
            rig.step(n)                                       # the FFN input and the router's routing
            load = expert_load(rig.routes(n)) if kind == "moe" else {}
            meas = {}
            for part, fn in rig.parts(n, own_routing=True).items():
                meas[part] = timer(fn, before=lambda r, p=part, n=n, g=rig: g.reset(p, n, default_stream()))
                emit({"table": "part", "part": f"{kind}.{part}", "layer": layer, "rows": n,
                      "context": context, "us": meas[part],
                      **(load if part in ("routed_experts", "layer") else {})})
            inner = [p for p in ("attention", "router", "routed_experts", "shared_expert", "dense_mlp")
                     if p in meas]
            emit({"table": "part", "part": f"{kind}.rest", "layer": layer, "rows": n, "context": context,
                  "us": meas["layer"] - sum(meas[p] for p in inner)})
        del rig


def time_step_parts(engine, rows_list, timer: Timer, emit, context: int) -> None:
    """The engine's once-per-step parts on its own buffers: embedding, final norm + lm_head + argmax, and
    (verify rows) the KV compaction + tree compile."""
    from kernels_numba import ops
    b, m, cfg = engine.buf, engine.model, engine.cfg
    eps = cfg.rms_norm_eps
    for n in rows_list:
        engine.set_meta(context, n)

        def head(s, n=n):
            ops.rmsnorm(b.x, b.h, m.norm, eps, b.meta, n, s)
            ops.linear(b.logits, b.x, m.head, b.meta, n, s)
            ops.argmax(b.amax, b.logits, b.meta, n, s)
        emit({"table": "part", "part": "embed", "rows": n, "context": context,
              "us": timer(lambda s, n=n: ops.embed(b.h, m.embed, b.ids, b.meta, n, s))})
        emit({"table": "part", "part": "head", "rows": n, "context": context, "us": timer(head)})
        if n > 1:                                          # a verify's KV compaction + tree compile (last:
            def tree(s):                                   # its warm-up rewrites the meta)
                ops.kv_compact(b.cache, b.ctl, cfg.num_hidden_layers, s)
                ops.tree_compile(b.ids, b.depth, b.vis, b.meta, b.ctl, s)
            emit({"table": "part", "part": "tree", "rows": n, "context": context, "us": timer(tree)})


# ---- the drafter's forward ----------------------------------------------------------------------------

def make_drafter(engine, seed: int, log):
    """(a callable run once per round: the drafter's forward on the device, its logits unused; its
    description; a function timing its captured round with a ``Timer``), or (None, why not, None)."""
    try:
        from . import k2_depth_drafter
        return k2_depth_drafter.random_drafter(engine, seed, log)
    except Exception as ex:  # noqa: BLE001 - the runs go on without it, and say so
        log(f"drafter FAILED {type(ex).__name__}: {ex}\n{traceback.format_exc()}")
        return None, f"not run: {type(ex).__name__}: {ex}", None


# ---- runs ---------------------------------------------------------------------------------------------

def oracle_source(p: float, oracle: str = "margin") -> str:
    """A run's acceptance source: "oracle p=0.8", or "oracle p=0.8, calibrated"."""
    return f"oracle p={p}" + ("" if oracle == "margin" else f", {oracle}")


def ddtree_run(engine, prompt: np.ndarray, n_tokens: int, budget, p: float, sequence: np.ndarray,
               seed: int, drafter=None, probe_rounds: int = 8, oracle: str = "calibrated") -> dict[str, Any]:
    """One greedy DDTree generation with the oracle drafter at ``p`` (``oracle``: its kind, ``--oracle``)
    through the engine's round methods (as ``engine.ddtree.engine_ddtree_generate`` runs them) with
    ``drafter(state)`` ahead of each draft; per-phase wall times, and the distinct experts and expert
    tiles of the verify's MoE layers, averaged over them, in the first rounds (``verify_routing``: the
    verify again, eagerly, left out of the times)."""
    from kernels_numba.sim import sim_speed

    from ..ddtree.budget import expected_tokens, tree_budget
    from ..ddtree.config import GREEDY
    from ..ddtree.oracle import OracleDrafter
    from ..engine.rounds import EngineSpecState
    cfg = engine.cfg
    draft = OracleDrafter(sequence, cfg.vocab_size, BLOCK, p, seed, calibrated=oracle == "calibrated")
    clock = dict.fromkeys(("drafter", "draft", "build", "verify", "walk"), 0.0)
    expected: list[float] = []                                # per round: E(N) of the verified tree
    probes: list[dict[str, float]] = []                       # per probed round: its MoE layers' load
    walls: list[float] = []                                   # per round: wall s
    with sim_speed():
        state = EngineSpecState(engine, draft, tree_budget(budget), GREEDY, np.asarray(prompt),
                                device_drafter=False)             # captures the verify step, prefills
        if drafter is not None:
            drafter.start(state)
        probe = 0.0
        t0 = time.perf_counter()
        while len(state.tokens) < n_tokens:
            ta = time.perf_counter()
            if drafter is not None:
                drafter(state)                                # launched; the draft's sync waits for it
            tb = time.perf_counter()
            state.draft()
            tc = time.perf_counter()
            n = state.build_tree()
            td = time.perf_counter()
            post = state.verify(n)
            te = time.perf_counter()
            if len(probes) < probe_rounds:
                probes.append(layers_load(verify_routing(engine, state.step_for[n] + 1, n + 1)))
            expected.append(float(expected_tokens(state.scores[1:n + 1])[-1]))   # E(N) the draft states
            tf = time.perf_counter()
            acc, bonus = state.walk(n, post)
            state.commit(n, acc, bonus)
            tg = time.perf_counter()
            probe += tf - te
            for k, dt in zip(clock, (tb - ta, tc - tb, td - tc, te - td, tg - tf), strict=True):
                clock[k] += dt
            walls.append(tg - ta - (tf - te))
        wall = time.perf_counter() - t0 - probe
    rounds = len(state.rounds)
    tokens = np.asarray(state.tokens[:n_tokens], np.int64)
    return {"tokens": tokens, "rounds": rounds, "wall_s": wall, "clock": clock, "round_walls": walls,
            "round_tokens": [r.accepted_len for r in state.rounds],
            "oracle_p": p, "expected_tau": float(np.mean(expected)),
            "tau": float(np.mean([r.accepted_len for r in state.rounds])),
            "tree_nodes": float(np.mean([r.tree_size for r in state.rounds])),
            **{k: float(np.mean([pr[k] for pr in probes])) if probes else float("nan")
               for k in ("unique_experts", "expert_tiles", "expert_reads", "last_layer_experts")}}


def prefill_repeat(engine, prompt: np.ndarray) -> dict[str, Any]:
    """The prompt's prefill twice on ``engine``: the first layer whose latent cache rows differ between the
    two (None: bitwise equal; a layer's rows depend only on the layers before it, so this names where a
    run-to-run difference enters), and the largest difference of the last row's logits."""
    from kernels_numba.device import head_rows
    p = len(prompt)
    out = []
    for _ in range(2):
        engine.prefill(prompt)
        cache = engine.fetch(engine.buf.cache)[:, :p]                               # [Ly, P, C+R]
        logits = engine.fetch(head_rows(engine.buf.logits, p))[p - 1]
        out.append((cache, logits))
    (c1, l1), (c2, l2) = out
    diff = [i for i in range(c1.shape[0]) if not np.array_equal(c1[i], c2[i])]
    return {"first_layer_differing": diff[0] if diff else None, "layers_differing": len(diff),
            "max_abs_logit_diff": float(np.abs(l1 - l2).max())}


def _trace(engine, prompt: np.ndarray, steps, slots) -> list[list[dict[str, Any]]]:
    """After the prompt's prefill, each of ``steps`` (a callable that loads its rows, and its row count)
    run layer by layer; per step, per layer, per row in ``slots``: the hidden state ``h``, and at a MoE
    layer the FFN input ``x`` (what the router saw) and the routed ``experts``."""
    from kernels_numba.device import head_rows

    from ..engine.model import launch_forward
    b = engine.buf
    engine.prefill(prompt)
    out = []
    for (load, n), rows in zip(steps, slots, strict=True):
        load()
        layers: list[list[dict[str, Any]]] = []

        def record(i: int, n: int = n, layers: list = layers, rows: list = rows) -> None:
            h = engine.fetch(head_rows(b.h, n))
            moe = engine.model.layers[i].moe is not None
            if moe:
                x = engine.fetch(head_rows(b.x, n))
                ids = engine.fetch(head_rows(engine.scratch.rids, n))
            layers.append([{"h": h[s].astype(np.float64)} | ({"x": x[s].astype(np.float64),
                           "experts": set(ids[s].tolist())} if moe else {}) for s in rows])
        launch_forward(engine, n, engine.stream, after_layer=record)
        out.append(layers)
    return out


def _parting(engine, one: list[dict[str, Any]], other: list[dict[str, Any]]) -> dict[str, Any]:
    """Two traces of one row, layer by layer (``_trace``): the relative difference of the hidden state per
    layer, the first MoE layer whose experts differ, the experts swapped there and the first trace's
    selection scores of them (sigmoid(logit) + bias: their gap is the near-tie the two float sums fell on
    either side of)."""
    from ..engine.build import host_array
    from ..reference.layers import sigmoid
    rel = [float(np.linalg.norm(a["h"] - c["h"]) / max(np.linalg.norm(a["h"]), 1e-30))
           for a, c in zip(one, other, strict=True)]
    res: dict[str, Any] = {"hidden_rel_diff": rel, "first_layer": None}
    for i, (a, c) in enumerate(zip(one, other, strict=True)):
        if "experts" in a and a["experts"] != c["experts"]:
            r = engine.model.layers[i].moe.router
            gate, bias = host_array(r.gate_t).astype(np.float64), host_array(r.bias).astype(np.float64)
            sel = sigmoid(a["x"] @ gate) + bias                                           # [E]
            only_one, only_tree = sorted(a["experts"] - c["experts"]), sorted(c["experts"] - a["experts"])
            res.update(first_layer=i, decode_only=only_one, tree_only=only_tree,
                       scores_decode_only=[float(sel[e]) for e in only_one],
                       scores_tree_only=[float(sel[e]) for e in only_tree],
                       score_gap=float(min(sel[only_one]) - max(sel[only_tree])),
                       ffn_input_rel_diff=float(np.linalg.norm(a["x"] - c["x"]) / np.linalg.norm(a["x"])))
            break
    return res


def parting_summary(r: dict[str, Any]) -> dict[str, Any]:
    """A ``_parting`` result in short: the first layer differing at all, the first routing apart, the
    selection-score gap there and the difference after the last layer."""
    return {"first_layer_differing": next((i for i, d in enumerate(r["hidden_rel_diff"]) if d > 0), None),
            "first_layer_routing_apart": r["first_layer"], "score_gap": r.get("score_gap"),
            "last_layer_rel_diff": r["hidden_rel_diff"][-1]}


def root_vs_decode(engine, prompt: np.ndarray, token: int, rows: int = 2) -> dict[str, Any]:
    """Where a verify's root row and AR's one-row decode part: after the prompt's prefill, ``token`` at
    position P run layer by layer alone (AR's step) and as the first of ``rows`` rows (a verify's root,
    followed by a chain of copies); row 0 compared layer by layer (``_parting``)."""
    p = len(prompt)

    def chain(n: int):
        return (lambda: engine.load_chain(np.full(n, token, np.int64), p)), n
    (one,) = _trace(engine, prompt, [chain(1)], [[0]])
    (other,) = _trace(engine, prompt, [chain(rows)], [[0]])
    return {"rows": rows, "token": int(token),
            **_parting(engine, [lay[0] for lay in one], [lay[0] for lay in other])}


def tree_vs_decode(engine, prompt: np.ndarray, path: np.ndarray) -> list[dict[str, Any]]:
    """Where a tree's other rows and AR's decode steps part: the D tokens of ``path`` decoded one by one
    after the prompt (AR), and verified as one tree of 2D - 1 rows in which every path node after the
    root follows a sibling (another token at the same depth, same parent), so its key sits two slots
    on per depth where AR's sits one position on. Per depth, the path row against AR's step
    (``_parting``): equal at every depth when the verify's rows sum as AR's do."""
    from ..ddtree.scenarios import ancestor_inputs
    p, d_max = len(prompt), len(path)
    vocab = engine.cfg.vocab_size
    tokens, parents, slot = [int(path[0])], [-1], [0]
    for d in range(1, d_max):
        for tok in ((int(path[d]) + 1) % vocab, int(path[d])):          # the sibling first, then the path
            tokens.append(tok)
            parents.append(slot[-1])
        slot.append(len(tokens) - 1)
    vis, pos = ancestor_inputs(parents, p)
    steps = [((lambda d=d: engine.load_chain(np.asarray(path[d:d + 1], np.int64), p + d)), 1)
             for d in range(d_max)]
    ar = _trace(engine, prompt, steps, [[0]] * d_max)
    (tree,) = _trace(engine, prompt, [(lambda: engine.load_rows(np.asarray(tokens), pos - p, vis, p),
                                       len(tokens))], [slot])
    return [{"depth": d, "slot": slot[d], **_parting(engine, [lay[0] for lay in ar[d]],
                                                     [lay[d] for lay in tree])} for d in range(d_max)]


def run_row(r: dict[str, Any], agree: dict[str, Any], ar_ms: float, source: str,
            budget: int) -> dict[str, Any]:
    """A DDTree run's result row (and, under "check", its greedy == AR check). A round's time is over
    every round (it does not depend on what is accepted); tau over the rounds before a mismatch (past it
    the oracle's truth, AR's tokens, is not the target's); expected_tau, the mean E(N) = 1 + p_1 + ... +
    p_N the draft's probabilities state for the verified trees (what a cost-aware budget reads)."""
    rms = r["wall_s"] / r["rounds"] * 1e3
    ms_tok = rms * agree["rounds"] / agree["tokens"]
    c = {k: v / r["rounds"] for k, v in r["clock"].items()}
    return {"table": "run", "source": source, "oracle_p": r["oracle_p"], "budget": budget,
            "tokens": agree["tokens"],
            "rounds": agree["rounds"], "tau": agree["tokens"] / agree["rounds"],
            "expected_tau": r["expected_tau"], "ms_per_token": ms_tok,
            "round_ms": rms, "speedup": ar_ms / ms_tok, "tokens_equal_ar": agree["equal"],
            "first_mismatch": agree["first"], "tree_nodes": r["tree_nodes"],
            "distinct_experts": r["unique_experts"], "expert_tiles": r["expert_tiles"],
            "expert_reads": r["expert_reads"], "last_layer_experts": r["last_layer_experts"],
            "drafter_ms_per_round": c["drafter"] * 1e3,
            "draft_ms_per_round": c["draft"] * 1e3, "build_us_per_round": c["build"] * 1e6,
            "verify_ms_per_round": c["verify"] * 1e3, "walk_us_per_round": c["walk"] * 1e6,
            "check": {"check": f"DDTree greedy == AR, {source} B={budget}", "passed": agree["passed"],
                      "first_mismatch": agree["first"], "ar_margin_there": agree["margin"]}}


def depth_cost_curve(fixed: list[dict[str, Any]]):
    """The stand-in's cost curve from one acceptance source's fixed-budget runs: the verify step's time per
    round at B + 1 rows, and the rest of a round (drafter, draft top-k, tree build, walk and commit) at the
    largest B, the tree a cost-aware round builds before it cuts (as ``bench pair`` reads the pair's)."""
    from ..ddtree.budget import CostCurve
    fixed = sorted(fixed, key=lambda r: r["budget"])
    top = fixed[-1]
    rest = (top["drafter_ms_per_round"] + top["draft_ms_per_round"]) * 1e3 + top["build_us_per_round"] \
        + top["walk_us_per_round"]
    return CostCurve(tuple(int(r["budget"]) + 1 for r in fixed),
                     tuple(float(r["verify_ms_per_round"]) * 1e3 for r in fixed), float(rest))


NEAR_TIE = 0.05        # an AR top-2 logit margin under which the 1-row and the tree path may differ


def _agreement(r: dict[str, Any], ar: np.ndarray, margins: np.ndarray) -> dict[str, Any]:
    """A DDTree run against AR: equal, the first mismatch (n if none) and AR's top-2 margin there; passed
    when equal or the mismatch falls on a near-tie (margin < NEAR_TIE: the paths' float32 sums in another
    order may pick the other token); the rounds, tokens and wall time before the first mismatch."""
    tok = r["tokens"]
    diff = np.flatnonzero(tok != ar[:len(tok)])
    if not diff.size:
        return {"equal": True, "first": len(tok), "margin": float("inf"), "passed": True,
                "tokens": len(tok), "rounds": r["rounds"], "wall_s": r["wall_s"]}
    first = int(diff[0]) if diff.size else len(tok)
    margin = float(margins[first]) if first < len(margins) else float("inf")
    done, rounds, wall = 0, 0, 0.0
    for w, k in zip(r["round_walls"], r["round_tokens"], strict=True):
        if done + k > first and rounds:
            break
        done, rounds, wall = done + k, rounds + 1, wall + w
    return {"equal": not diff.size, "first": first, "margin": margin,
            "passed": bool(not diff.size or margin < NEAR_TIE), "tokens": done, "rounds": rounds,
            "wall_s": wall}


def pair_tau(bench_dir: Path, model: str = "code") -> tuple[dict[int, float], str | None]:
    """{B: tokens / rounds} of the current pair set's DDTree runs of ``model`` over all its prompts (the
    trained pair's measured acceptance), and the set's name; ({}, None) without one."""
    from ..results import current_set, read_csv
    rs = current_set(bench_dir, "pair")
    if rs is None:
        return {}, None
    tok: dict[int, float] = {}
    rnd: dict[int, float] = {}
    for r in read_csv(rs.csv):
        if r["model"] == model and r["mode"] == "ddtree":
            b = int(r["budget"])
            tok[b] = tok.get(b, 0.0) + float(r["tokens"])
            rnd[b] = rnd.get(b, 0.0) + float(r["rounds"])
    return {b: tok[b] / rnd[b] for b in tok if rnd[b]}, rs.stem


# ---- the layer checks ---------------------------------------------------------------------------------

CHECK_PREFIX, CHECK_NODES = 4, 4


def _reference(cfg, seed: int, layer: int, weights) -> dict:
    from ..ddtree.scenarios import layer_reference as reference_side
    return reference_side(cfg, seed, layer, "int4", "bf16", CHECK_PREFIX, CHECK_NODES, weights=weights)


def check_engine_side(cfg, model, layer: int, seed: int) -> tuple[dict, dict]:
    """(engine side of ``k2_check``'s scenarios on the stand-in's layer, the layer's weights for the
    reference: the routed experts its prefix and steps touched)."""
    from ..ddtree.scenarios import layer_inputs as _inputs
    from ..engine.build import layer_weights
    from ..engine.layer import LayerRig
    from ..engine.scenarios import engine_layer as engine_side
    lay = model.layers[layer]
    rig = LayerRig(cfg, layer, lay, CHECK_NODES + 1, CHECK_PREFIX + CHECK_NODES + 2)
    experts: set[int] = set()
    if cfg.is_moe_layer(layer):                              # the prefix's own experts (its MoE runs too)
        x_pre, _ = _inputs(cfg, seed, layer, CHECK_PREFIX, CHECK_NODES)
        rig.load(x_pre, 0, np.arange(CHECK_PREFIX), np.tril(np.ones((CHECK_PREFIX, CHECK_PREFIX), np.uint8)))
        rig.step(CHECK_PREFIX)
        experts |= set(rig.routes(CHECK_PREFIX).ravel().tolist())
    eng = engine_side(cfg, seed, rig, CHECK_PREFIX, CHECK_NODES)
    for st in eng["steps"]:
        if st["routes"] is not None:
            experts |= set(np.asarray(st["routes"]).ravel().tolist())
    return eng, layer_weights(cfg, lay, layer, sorted(experts) if cfg.is_moe_layer(layer) else None)


# ---- the whole run ------------------------------------------------------------------------------------

def bench(out_dir: Path, sets: int = 0, prompt_len: int = 512, n_tokens: int = 128, budgets=BUDGETS,
          ps=ORACLE_P, reps: int = 20, seed: int = 0, deadline_s: float = 470.0, check: bool = True,
          drafter: str = "engine", oracle: str = "calibrated", dry_run: bool = False, progress=None):
    """Build, check and time the stand-in; writes the result set ``k2_depth_<commit>`` into ``out_dir``.
    progress: ``progress(done, total, what)`` before each stage and each DDTree run."""
    from kernels_numba import ops
    from kernels_numba.device import SIMULATED, on_gpu

    from ..ddtree.budget import TreeBudget
    from ..ddtree.oracle import hit_rate
    from ..engine.ar import engine_ar_generate
    from ..engine.build import RandomSource, build_model
    from ..engine.runtime import Engine
    from ..errors import InputError
    from ..fileio import write_json_atomic
    from ..k2proj import depth_parts, project_depth
    from ..reference.generate import top2_margin
    from ..results import result_set, write_csv

    if dry_run != SIMULATED:
        raise InputError("--dry-run runs under NUMBA_ENABLE_CUDASIM=1 (and only there)")
    gpu = on_gpu()
    cfg, taps = _config(dry_run)
    if dry_run:
        prompt_len, n_tokens, budgets, ps, reps = min(prompt_len, 6), min(n_tokens, 4), budgets[:2], ps[:1], 1
        ops.BLAS = True                                   # W16A16 on torch's CPU BLAS
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f} s] {msg}", flush=True)

    if gpu:
        from .common import copy_bandwidth, run_metadata
        meta = run_metadata(bench="k2_depth")
    else:
        meta = {"bench": "k2_depth", "git_sha": "dry-run", "time_utc": "dry-run"}
    pair, pair_set = pair_tau(Path("reports/bench"))
    meta.update(model=f"k2_6 ({cfg.num_hidden_layers} layers)" if not dry_run else "tiny2-like dry run",
                weights=LABEL, prompt_tokens=prompt_len, new_tokens=n_tokens, budgets=list(budgets),
                oracle_p=list(ps), oracle=oracle, reps=reps, seed=seed, taps=list(taps), block_size=BLOCK,
                pair_set=pair_set, pair_tau={str(b): t for b, t in sorted(pair.items())},
                acceptance=("oracle drafter at p (the AR run's tokens as the true continuation), and the "
                            "trained code pair's tau(B) = its tokens / rounds over the current pair set's "
                            "HumanEval DDTree runs (model code) times this stand-in's measured round time "
                            "at B"))
    rs = result_set(out_dir, "k2_depth", meta["git_sha"])
    rows: list[dict] = []
    checks: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        log("  " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                             if v is not None))
        write_csv(rows, rs.csv)

    def save() -> None:
        write_json_atomic(rs.meta, {**meta, "checks": checks, "checks_passed": bool(checks) and all(
            c["passed"] for c in checks), "elapsed_s": round(time.perf_counter() - t_start, 1)})

    if gpu:
        meta["copy_gbs"] = round(copy_bandwidth(), 1)
    stages = [0, 7 + len(ps) * (len(budgets) + 1)]        # done, total

    def stage(what: str) -> None:
        if progress is not None:
            progress(min(stages[0], stages[1]), stages[1], what)
        stages[0] += 1

    # ---- build
    stage("build")
    import torch
    t = time.perf_counter()
    if gpu:
        torch.cuda.empty_cache()                           # the copy-rate buffers, back to the device
    free = torch.cuda.mem_get_info()[0] if gpu else 1 << 62
    reserve = 24 << 30            # embed 4.7 GB, head 2.35, dense layer 1.0, drafter 6.9, buffers, workspaces
    s = choose_sets(cfg, free, reserve, sets) if gpu else (sets or 2)
    if s < (MIN_SETS if gpu else 1):
        raise InputError(f"only {s} distinct MoE weight sets fit; the stand-in wants at least {MIN_SETS}")
    src = RandomSource(cfg, seed)
    model = build_model(cfg, src, sets=s)
    meta.update(sets=s, set_gb=round(set_bytes(cfg) / 1e9, 2), source=src.describe(),
                build_s=round(time.perf_counter() - t, 1))
    log(f"built the stand-in: {cfg.num_hidden_layers} layers, MoE over {s} distinct sets, "
        f"{meta['build_s']} s; {LABEL}")
    max_b = max(budgets)
    engine = Engine(cfg, None, max_len=prompt_len + n_tokens + BLOCK + max_b + 4,
                    max_rows=max(prompt_len, max_b + 1), taps=taps, model=model)
    save()
    # ---- checks: engine side now, the reference in a child process
    stage("layer checks, engine side")
    pool, refs, engs = None, {}, {}
    if check:
        from .k2_layer import _blas_threads
        pool = ProcessPoolExecutor(2, mp_context=mp.get_context("spawn"))
        for layer in (0, cfg.first_k_dense_replace):
            t = time.perf_counter()
            engs[layer], w = check_engine_side(cfg, model, layer, seed)
            with _blas_threads(max(1, (os.cpu_count() or 2) // 3)):
                refs[layer] = pool.submit(_reference, cfg, seed, layer, w)
            del w
            log(f"check layer {layer}: engine side in {time.perf_counter() - t:.1f} s, reference started")
    # ---- AR
    stage("AR")
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, cfg.vocab_size, prompt_len).astype(np.int64)
    ar_n = n_tokens + BLOCK
    ar = None
    ar_runs = []
    for _ in range(2):
        timing: dict = {}
        res = engine_ar_generate(engine, prompt, ar_n, timing=timing)
        ms = timing["decode_s"] / (ar_n - 1) * 1e3
        ar_runs.append(ms)
        if ar is not None and not np.array_equal(ar, res.tokens):
            checks.append({"check": "AR repeat", "passed": False})
        ar = res.tokens
    ar_ms = min(ar_runs)
    meta["ar_ms_runs"] = ar_runs
    with_logits = engine_ar_generate(engine, prompt, n_tokens, return_logits=True)     # untimed: margins
    margins = np.array([top2_margin(lg) for lg in with_logits.logits])
    if not np.array_equal(with_logits.tokens, ar[:n_tokens]):
        checks.append({"check": "AR repeat with logits", "passed": False})
    meta["ar_margin_min"] = float(margins.min())
    from kernels_numba.sim import sim_speed
    with sim_speed():                                   # where a run-to-run difference enters, if one does
        meta["prefill_repeat"] = prefill_repeat(engine, prompt)
    log(f"prefill twice: {meta['prefill_repeat']}")
    with sim_speed():                                   # where AR's step and a verify's root part, if they do
        meta["root_vs_decode"] = root_vs_decode(engine, prompt, int(ar[0]), min(max(budgets) + 1, 4))
    rvd = meta["root_vs_decode"]
    log(f"root row vs decode row: first MoE layer routing apart {rvd['first_layer']}, "
        f"selection-score gap there {rvd.get('score_gap')}, hidden-state difference at the last layer "
        f"{rvd['hidden_rel_diff'][-1]:.2e}")
    by_rows = {}                                        # the same at every verify size the run uses
    for n in sorted({b + 1 for b in budgets} - {rvd["rows"]}):
        with sim_speed():
            by_rows[n] = parting_summary(root_vs_decode(engine, prompt, int(ar[0]), n))
        log(f"root row of {n} rows vs decode row: {by_rows[n]}")
    meta["root_vs_decode_by_rows"] = by_rows
    with sim_speed():                                   # a tree's other rows: keys at slots, not positions
        meta["tree_vs_decode"] = [{"depth": t["depth"], "slot": t["slot"], **parting_summary(t)}
                                  for t in tree_vs_decode(engine, prompt, ar[:3])]
    log(f"tree rows (each after a sibling) vs AR's steps: {meta['tree_vs_decode']}")
    meta["ar_margins_below_near_tie"] = int((margins < NEAR_TIE).sum())
    drafted = range(prompt_len + 1, prompt_len + n_tokens)         # the acceptance this seed's draws give
    meta["oracle_hit_rate"] = {str(p): hit_rate(seed, drafted, cfg.vocab_size, p) for p in ps}
    log(f"oracle hit rate as drawn at the {len(drafted)} drafted positions, per p: {meta['oracle_hit_rate']}")
    emit({"table": "run", "source": "ar", "budget": 0, "tokens": ar_n - 1, "rounds": ar_n - 1, "tau": 1.0,
          "ms_per_token": ar_ms, "round_ms": ar_ms, "speedup": 1.0, "tokens_equal_ar": True})
    sequence = np.concatenate([prompt, ar])
    save()
    # ---- parts
    stage("parts")
    timer = Timer(gpu, reps)
    context = prompt_len + n_tokens // 2
    rows_list = sorted({1, *(b + 1 for b in budgets)}) if not dry_run else [1, 2]
    try:
        time_layer_parts(cfg, model, context, rows_list, timer, emit, seed)
        time_step_parts(engine, rows_list, timer, emit, context)
    except Exception as ex:  # noqa: BLE001 - the runs still count
        log(f"parts FAILED {type(ex).__name__}: {ex}\n{traceback.format_exc()}")
    save()
    # ---- the drafter
    stage("drafter")
    t = time.perf_counter()
    fwd, how, draft_timed = (None, "not run (--drafter none)", None) if drafter == "none" else \
        make_drafter(engine, seed, log)
    meta["drafter"] = how
    log(f"drafter ({time.perf_counter() - t:.1f} s): {how}")
    # ---- DDTree: one short untimed generation first (the host tree heap's compile, the first captures)
    stage("DDTree warm-up")
    t = time.perf_counter()
    ddtree_run(engine, prompt, min(16, n_tokens), budgets[0], ps[0], sequence, seed, fwd, oracle=oracle)
    log(f"DDTree warm-up in {time.perf_counter() - t:.1f} s")
    round_ms: dict[int, list[float]] = {}
    est: dict[int, float] = {}
    left_out = []
    for p, b in run_order(ps, budgets):
        stage(f"DDTree p={p} B={b}")
        elapsed = time.perf_counter() - t_start
        # a larger budget leaves time for every p's cost-aware run (one near FIRST_BUDGETS' time each)
        reserve = len(ps) * est.get(FIRST_BUDGETS, 0.0) if b > FIRST_BUDGETS else 0.0
        if elapsed + est.get(b, 0.0) + reserve > deadline_s:
            left_out.append(f"p={p} B={b}")
            continue
        t = time.perf_counter()
        try:
            r = ddtree_run(engine, prompt, n_tokens, b, p, sequence, seed, fwd, oracle=oracle)
        except Exception as ex:  # noqa: BLE001 - one run's failure
            log(f"DDTree p={p} B={b} FAILED {type(ex).__name__}: {ex}\n{traceback.format_exc()}")
            left_out.append(f"p={p} B={b} (failed)")
            continue
        est[b] = time.perf_counter() - t
        if draft_timed is not None:                           # its round, at a real round's positions
            us, nbytes = draft_timed(timer, context)
            floor = nbytes / (meta["copy_gbs"] * 1e3) if meta.get("copy_gbs") else 0.0
            emit({"table": "part", "part": "drafter", "rows": BLOCK, "context": context, "us": us,
                  "bytes": nbytes, "floor_us": round(floor, 2)})
            log(f"drafter round: {us:.1f} us, floor {floor:.1f} us ({nbytes / 1e6:.1f} MB at the copy "
                "rate)")
            draft_timed = None
        row = run_row(r, _agreement(r, ar[:n_tokens], margins), ar_ms, oracle_source(p, oracle), b)
        checks.append(row.pop("check"))
        round_ms.setdefault(b, []).append(row["round_ms"])
        emit(row)
        save()
    for p in ps:
        # the cost-aware budget over this p's measured curve, against its best fixed budget
        fixed = [r for r in rows if r.get("table") == "run" and r.get("source") == oracle_source(p, oracle)]
        if len(fixed) < 2 or time.perf_counter() - t_start + max(est.values()) > deadline_s:
            left_out.append(f"p={p} cost-aware")
            continue
        try:
            auto = TreeBudget(max(r["budget"] for r in fixed), depth_cost_curve(fixed))
            r = ddtree_run(engine, prompt, n_tokens, auto, p, sequence, seed, fwd, oracle=oracle)
        except Exception as ex:  # noqa: BLE001 - one run's failure
            log(f"DDTree p={p} cost-aware FAILED {type(ex).__name__}: {ex}\n{traceback.format_exc()}")
            left_out.append(f"p={p} cost-aware (failed)")
            continue
        row = run_row(r, _agreement(r, ar[:n_tokens], margins), ar_ms,
                      f"{oracle_source(p, oracle)}, cost-aware", auto.max_nodes)
        checks.append(row.pop("check"))
        best = min(fixed, key=lambda f: f["ms_per_token"])
        emit({**row, "table": "cost_aware", "best_fixed_budget": best["budget"],
              "best_fixed_ms_per_token": best["ms_per_token"],
              "vs_best_fixed": best["ms_per_token"] / row["ms_per_token"]})
        save()
    meta["left_out"] = left_out
    for b in budgets:                                         # the pair's acceptance, replayed
        if b in pair and b in round_ms:
            rms = statistics.mean(round_ms[b])
            emit({"table": "run", "source": "pair code (replayed)", "budget": b, "tau": pair[b],
                  "round_ms": rms, "ms_per_token": rms / pair[b], "speedup": ar_ms * pair[b] / rms})
    # ---- checks: the reference sides
    stage("layer checks, reference side")
    if pool is not None:
        from ..engine.scenarios import compare_layer as compare
        for layer, fut in refs.items():
            try:
                ref = fut.result(timeout=max(10.0, deadline_s + 60 - (time.perf_counter() - t_start)))
                for c in compare(cfg, seed, layer, "int4", "bf16", engs[layer], ref, CHECK_PREFIX,
                                 CHECK_NODES, log=log):
                    checks.append({"check": f"layer {layer} {c['scenario']}", "passed": bool(c["passed"]),
                                   "max_rel_err": c["max_rel_err"], "tol": c["tol"]})
            except Exception as ex:  # noqa: BLE001 - a reference that did not finish is a failed check
                log(f"check layer {layer} FAILED {type(ex).__name__}: {ex}")
                checks.append({"check": f"layer {layer} reference", "passed": False,
                               "error": f"{type(ex).__name__}: {ex}"})
        pool.shutdown(wait=False, cancel_futures=True)
    # ---- the projection beside the measurement (a dry run times nothing: its parts are NaN)
    if dry_run:
        log("projection skipped: a dry run has no timed parts")
    else:
        try:
            proj = project_depth(cfg, depth_parts(rows), [r for r in rows if r.get("table") == "run"])
            for pr in proj:
                emit({"table": "projection", **pr})
        except Exception as ex:  # noqa: BLE001
            log(f"projection FAILED {type(ex).__name__}: {ex}\n{traceback.format_exc()}")
    try:
        plot(rows, rs.plot, f"{LABEL}, {s} distinct MoE sets")
    except Exception as ex:  # noqa: BLE001
        log(f"plot FAILED {type(ex).__name__}: {ex}")
    save()
    log(f"checks: {sum(c['passed'] for c in checks)}/{len(checks)} passed; wrote {rs.csv}, {rs.meta}")
    stage("done")
    return rs


def plot(rows: list[dict], path: Path, title: str) -> None:
    """ms per token against the budget (each acceptance source, AR as a line, the projection dashed), and
    the measured round split per budget (p = 0.8 runs)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..fileio import save_figure_atomic
    runs = [r for r in rows if r.get("table") == "run"]
    proj = [r for r in rows if r.get("table") == "projection"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for src in dict.fromkeys(r["source"] for r in runs if r["source"] != "ar"):
        sel = sorted((r for r in runs if r["source"] == src), key=lambda r: r["budget"])
        line, = a.plot([r["budget"] for r in sel], [r["ms_per_token"] for r in sel], "o-", label=src)
        ps = sorted((r for r in proj if r["source"] == src), key=lambda r: r["budget"])
        if ps:
            a.plot([r["budget"] for r in ps], [r["projected_ms_per_token"] for r in ps], "--",
                   color=line.get_color())
    for r in runs:
        if r["source"] == "ar":
            a.axhline(r["ms_per_token"], color="k", lw=1, label=f"AR {r['ms_per_token']:.1f} ms")
    a.set(xscale="log", xlabel="budget B (tree nodes)", ylabel="ms per generated token",
          title="measured (solid) and projected (dashed)")
    a.legend(fontsize=7)
    sel = sorted((r for r in runs if r["source"] in (oracle_source(0.8), oracle_source(0.8, "calibrated"))),
                 key=lambda r: r["budget"])
    if sel:
        x = np.arange(len(sel))
        bottom = np.zeros(len(sel))
        for key, lab in (("drafter_ms_per_round", "drafter (launch)"),
                         ("draft_ms_per_round", "draft + top-k"),
                         ("build_us_per_round", "tree build (host)"), ("verify_ms_per_round", "verify"),
                         ("walk_us_per_round", "walk + commit (host)")):
            v = np.array([r.get(key) or 0.0 for r in sel]) / (1e3 if key.endswith("us_per_round") else 1.0)
            b.bar(x, v, bottom=bottom, label=lab)
            bottom += v
        b.set_xticks(x, [str(r["budget"]) for r in sel])
        b.set(xlabel="budget B", ylabel="ms per round", title="a round's wall time by phase (oracle p = 0.8)")
        b.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure_atomic(fig, path)
    plt.close(fig)


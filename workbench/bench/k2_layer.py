"""``bench k2``: each layer of the seeded ``k2_slice`` on the engine's kernels, checked and timed.

Legend: T rows of a step (1 for decode, N + 1 for a verify of an N-node tree), D model width, K
experts per token, E routed experts, P prefix rows before a step.

Each layer is built by ``engine.build`` (``layer``) into an ``engine.layer.LayerRig`` (the engine's
buffers for one layer; its step is ``engine.model.launch_layer``, the code the engine runs per layer)
and checked by the one layer check (``engine.scenarios``: a P-row prefix, a decode step and a verify
of a 17-row tree on the device, ``ddtree.scenarios.layer_reference`` on the numpy reference, each
row's update y - x and the latent rows compared); ``run`` computes the reference sides in other
processes while the device builds and times. ``time_layer`` (GPU) times, per row
count, the attention, router, routed experts (random routing sets rotated between replays, and the
router's own routing of the tree rows), shared expert or dense MLP and the whole layer, each in its
own CUDA graph (``engine.graphs.StepGraph``), behind a spin kernel, with a 256 MiB write before every
replay so weights come from HBM; "rest" is the layer minus its parts (norms, conversions, adds).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import statistics
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from kernels_numba.device import default_stream, head_rows, upload

from ..config import ModelConfig, preset
from ..ddtree.scenarios import ancestor_inputs, layer_reference, random_tree
from ..engine.buffers import latents_for
from ..engine.build import MappingSource, SeededSource, build_layer
from ..engine.kinds import DenseKind, ExpertKind, kind
from ..engine.layer import LayerRig
from ..engine.scenarios import compare_layer, engine_layer
from ..errors import InputError
from ..reference.moe import analytic_coverage
from .k2_build import layer_bytes

ROWS = (1, 2, 3, 5, 9, 17, 33, 65)  # decode, then trees of 1, 2, 4, ..., 64 nodes + root
CHECKED = (ExpertKind.INT4, ExpertKind.BF16)   # the expert kinds checked and timed at every row count


def layer(cfg: ModelConfig, src, i: int, experts: ExpertKind | str = ExpertKind.INT4,
          dense: DenseKind | str = DenseKind.FP32, workers: int = 1):
    """Layer i on the device through ``engine.build``: of the seeded model (``src`` its seed), routed
    experts as ``experts``; or of a weights mapping (a lazy checkpoint), which runs the INT4 experts it
    holds, repacked on ``workers`` processes."""
    experts = kind(ExpertKind, experts, "experts")
    if isinstance(src, int):
        return build_layer(cfg, SeededSource(cfg, src, dense, experts, workers), i)
    if experts != ExpertKind.INT4:
        raise InputError(f"a checkpoint's layer runs the experts it holds (int4), not {experts}")
    return build_layer(cfg, MappingSource(cfg, src, dense=dense, workers=max(1, workers)), i)


def union_model(e: int, k: int, n: int) -> float:
    """Expected distinct experts of n tokens routed uniformly (``report.spec.analytic_coverage``)."""
    return float(analytic_coverage(e, k, n))


# ---- timing (GPU) ------------------------------------------------------------------------------------
def routing_sets(cfg: ModelConfig, n: int, sets: int = 8, seed: int = 0) -> list[np.ndarray]:
    """``sets`` random routings [n, K] (K distinct experts per row)."""
    rng = np.random.default_rng(seed * 1000 + n)
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    return [np.stack([rng.permutation(e)[:k] for _ in range(n)]).astype(np.int32) for _ in range(sets)]


def _floor_bytes(
    cfg: ModelConfig, layer: int, part: str, n: int, context: int, uniq: float, experts: str,
    dense: str = "fp32",
) -> tuple[float, float]:
    """(bytes this implementation must read, bytes of the K2-Thinking layout) for a part; ``dense``
    "bf16": the attention's weights, shared expert and dense MLP at 2 bytes and the latent cache's rows
    in bf16 (W16A16)."""
    lb = layer_bytes(cfg, layer)
    kv = context + n
    w = 2 if dense == DenseKind.BF16 else 4
    if part == "step_rows":                           # rope rows and the key mask: no weights
        return 0.0, 0.0
    if part == "attention":
        row = lb[f"kv_row_{dense}"]
        return lb["attention_params"] * w + kv * row, lb["attention_params"] * 2 + kv * lb["kv_row_bf16"]
    if part == "router":
        return lb["router_params"] * 4, lb["router_params"] * 2
    if part == "routed_experts":
        return uniq * lb["expert_" + experts], uniq * lb["expert_int4"]
    if part == "shared_expert":
        return lb["shared_params"] * w, lb["shared_params"] * 2
    if part == "dense_mlp":
        return lb["mlp_params"] * w, lb["mlp_params"] * 2
    if part.startswith("moe_block"):
        parts = ["router", "routed_experts", "shared_expert"]
    elif cfg.is_moe_layer(layer):
        parts = ["attention", "router", "routed_experts", "shared_expert"]
    else:
        parts = ["attention", "dense_mlp"]
    both = [_floor_bytes(cfg, layer, p, n, context, uniq, experts, dense) for p in parts]
    return sum(b[0] for b in both), sum(b[1] for b in both)


def time_layer(
    cfg: ModelConfig,
    rig: LayerRig,
    experts: str,
    context: int,
    rows_list,
    reps: int,
    copy_gbs: float,
    emit,
    log=print,
    seed: int = 0,
    budget_s: float = 1e9,
) -> None:
    """Time every part of ``rig`` per row count; ``emit(row)`` gets each CSV row as it is measured."""
    import torch

    from ..engine.graphs import StepGraph
    from .common import spin_timed

    layer = rig.layer
    rng = np.random.default_rng(seed)
    context_rows = rng.standard_normal((context, cfg.kv_cache_dim))
    upload(head_rows(rig.cache, context), latents_for(rig.cache, context_rows))
    flush_buf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    t_start = time.perf_counter()
    for n in rows_list:
        if time.perf_counter() - t_start > budget_s:
            log(f"  layer {layer} {experts}: time budget {budget_s:.0f} s spent, rows >= {n} left out")
            break
        parents, _ = random_tree(cfg, n - 1, seed=n)
        vis, pos = ancestor_inputs(parents, context)
        x = rng.standard_normal((n, cfg.hidden_size)).astype(np.float32)
        rig.load(x, context, pos - context, vis.astype(np.uint8))
        rig.step(n)  # fills x (the FFN input), x16 and the router's routing
        own = rig.routes(n) if cfg.is_moe_layer(layer) else None
        sets = routing_sets(cfg, n, seed=seed)
        variants = [("random", False), ("router", True)] if own is not None else [("-", False)]
        meas: dict[str, float] = {}
        for routing, own_r in variants:
            if own_r:                                 # what the layer replays left: the router's routing
                own = rig.routes(n)
            for part, fn in rig.parts(n, own_routing=own_r, moe_block=True).items():
                if routing == "router" and part != "routed_experts":
                    continue
                rotate = part == "routed_experts" and routing == "random"

                def before(r: int, rotate=rotate, part=part) -> None:
                    if rotate:
                        upload(head_rows(rig.ids, n), sets[r % len(sets)])  # noqa: B023
                    rig.reset(part, n, default_stream())  # noqa: B023 - outside the timed interval
                    flush_buf.zero_()

                try:
                    if rotate:
                        upload(head_rows(rig.ids, n), sets[0])
                    g = StepGraph(fn, True)
                    samples = spin_timed(lambda g=g: g.run(None), reps, before=before)
                except Exception as ex:  # noqa: BLE001 - one part's failure
                    log(f"  layer {layer} {experts} {part} T={n}: FAILED {type(ex).__name__}: {ex}")
                    continue
                if part == "routed_experts":
                    uniq = (
                        float(statistics.median(len(np.unique(s)) for s in sets))
                        if rotate
                        else float(len(np.unique(own)))
                    )
                elif (part in ("layer", "router") or part.startswith("moe_block")) and own is not None:
                    uniq = float(len(np.unique(own)))
                else:
                    uniq = float("nan")
                us = statistics.median(samples)
                key = part if routing != "random" or part != "routed_experts" else "routed_random"
                meas[key] = us
                emit(
                    _row(
                        cfg,
                        layer,
                        experts,
                        part,
                        routing if part == "routed_experts" else ("router" if own is not None else "-"),
                        n,
                        context,
                        us,
                        samples,
                        uniq,
                        copy_gbs,
                        union_model(e, k, n) if own is not None else None,
                        rig.lay.dense_kind,
                    )
                )
            rig.sync()
        if "layer" in meas:
            parts = [
                p
                for p in ("attention", "router", "routed_experts", "shared_expert", "dense_mlp")
                if p in meas
            ]
            if len(parts) == (4 if own is not None else 2):
                rest = meas["layer"] - sum(meas[p] for p in parts)
                emit(
                    {
                        "layer": layer,
                        "experts": experts,
                        "dense": rig.lay.dense_kind,
                        "impl": "numba engine",
                        "part": "rest",
                        "routing": "router",
                        "rows": n,
                        "tree_nodes": n - 1,
                        "context": context,
                        "us": round(rest, 2),
                    }
                )


def _row(cfg, layer, experts, part, routing, n, context, us, samples, uniq, copy_gbs, union,
         dense: str = "fp32") -> dict:
    u = uniq if not math.isnan(uniq) else 0.0
    nb, nb_k2 = _floor_bytes(cfg, layer, part, n, context, u, experts, dense)
    floor, floor_k2 = nb / (copy_gbs * 1e3), nb_k2 / (copy_gbs * 1e3)
    return {
        "layer": layer,
        "experts": experts,
        "dense": dense,
        "impl": "numba engine",
        "part": part,
        "routing": routing,
        "rows": n,
        "tree_nodes": n - 1,
        "context": context,
        "us": round(us, 2),
        "min_us": round(min(samples), 2),
        "max_us": round(max(samples), 2),
        "unique_experts": None if math.isnan(uniq) else uniq,
        "union_model": None if union is None else round(union, 1),
        "bytes": int(nb),
        "floor_us": round(floor, 2),
        "pct_floor": round(100 * floor / us, 1),
        "bytes_k2": int(nb_k2),
        "floor_k2_us": round(floor_k2, 2),
        "captured": True,
    }


# ---- the whole run -----------------------------------------------------------------------------------
def run(
    out_dir,
    layers=None,
    context: int = 4096,
    reps: int = 30,
    fp32_layer: int | None = 1,
    bf16_layer: int | None = 1,
    torch_baseline: bool = True,
    do_check: bool = True,
    workers: int = 16,
    seed: int = 0,
    fp32_after_s: float = 260.0,
    start_before_s: float = 330.0,
    dense: tuple[str, ...] = ("fp32",),
    checkpoint=None,
    progress=None,
):
    """Check and time each layer of k2_slice; writes the result set ``k2_layer_<commit>`` into out_dir.
    ``checkpoint``: a HF checkpoint folder whose ``layers`` are checked and timed instead (opened lazily,
    ``workbench.checkpoint``; its own INT4 experts only, no torch baseline), with the host's RSS logged.
    ``dense``: the ways to hold the dense projections, each layer built and timed once per way
    ("fp32": widened, "bf16": W16A16 on the BLAS path); ``bf16_layer``: the MoE layer also run with
    BF16 experts (grouped GEMMs) and W16A16 dense projections where ``dense`` has them; ``fp32_layer``
    the one also run with FP32 experts (portable FFN, the seed engine's placeholder). ``progress``:
    ``progress(done, total, what)`` before each planned layer run."""
    import torch
    from numba import cuda

    from ..fileio import write_json_atomic
    from ..results import result_set, write_csv
    from .common import copy_bandwidth, run_metadata

    cfg, src, model = preset("k2_slice"), seed, "k2_slice"
    if checkpoint is not None:                        # real layers: read from the mapped files when built
        from ..checkpoint import open_checkpoint
        src = open_checkpoint(checkpoint)
        cfg, model, fp32_layer, bf16_layer, torch_baseline = src.cfg, str(checkpoint), None, None, False
    layers = list(range(cfg.num_hidden_layers)) if layers is None else list(layers)
    dense = tuple(kind(DenseKind, d, "dense") for d in dense)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = run_metadata(bench="k2_layer", model=model, context=context, reps=reps, rows=list(ROWS),
                        dense=list(dense))
    rs = result_set(out, "k2_layer", meta["git_sha"])
    rows: list[dict] = []
    checks: list[dict] = []
    t0 = time.perf_counter()

    def log(msg) -> None:
        print(f"[{time.perf_counter() - t0:7.1f} s] {msg}", flush=True)

    def emit(row) -> None:
        rows.append(row)
        log("  " + ", ".join(f"{k}={v}" for k, v in row.items() if v is not None))
        write_csv(rows, rs.csv)

    def save_meta() -> None:
        write_json_atomic(
            rs.meta, {**meta, "checks": checks, "elapsed_s": round(time.perf_counter() - t0, 1)}
        )

    meta["copy_gbs"] = round(copy_bandwidth(), 1)
    log(f"copy rate {meta['copy_gbs']} GB/s; layers {layers}; context {context}")
    save_meta()
    max_len, max_rows = context + max(ROWS), max(ROWS)
    plan = []                                 # FP32 experts right after that layer's INT4 run
    for i in layers:
        plan += [(i, ExpertKind.INT4, d) for d in dense]
        if i == bf16_layer and cfg.is_moe_layer(i):          # BF16 experts beside INT4, the rest as K2's
            plan.append((i, ExpertKind.BF16, DenseKind.BF16 if DenseKind.BF16 in dense else dense[0]))
        if i == fp32_layer and cfg.is_moe_layer(i):
            plan.append((i, ExpertKind.FP32, DenseKind.FP32))
    # the reference side of every check runs on the host's cores while the device builds and times
    checked = [(i, e, d) for i, e, d in plan if e in CHECKED]
    pool, refs = None, {}
    if do_check and checked:
        n_ref = min(4, len(checked))
        pool = ProcessPoolExecutor(n_ref, mp_context=mp.get_context("spawn"))
        with _blas_threads(max(1, (os.cpu_count() or 1) // (n_ref + 1))):   # spawned now, with this limit
            refs = {key: pool.submit(layer_reference, cfg, seed, *key, weights=src if checkpoint else None)
                    for key in checked}
    engine_out: dict = {}

    def compare_ready(wait: bool) -> None:
        for key in [k for k in engine_out if wait or refs[k].done()]:
            i, e, d = key
            try:
                eng = engine_out.pop(key)
                checks.extend(compare_layer(cfg, seed, i, e, d, eng, refs[key].result(), log=log))
            except Exception as ex:  # noqa: BLE001 - a failed reference is a failed check, not a lost run
                log(f"check layer {i} ({e} experts, {d} dense) FAILED {type(ex).__name__}: {ex}")
                checks.append({"layer": i, "experts": e, "dense": d, "scenario": "reference",
                               "error": f"{type(ex).__name__}: {ex}", "passed": False})
            save_meta()
    for step, (li, experts, dn) in enumerate(plan):
        if progress is not None:
            progress(step, len(plan), f"layer {li}, {experts} experts, {dn} dense")
        if time.perf_counter() - t0 > start_before_s:
            log(f"layer {li} ({experts}) left out: {time.perf_counter() - t0:.0f} s spent "
                f"(nothing starts after {start_before_s:.0f} s)")
            continue
        if experts == ExpertKind.FP32 and time.perf_counter() - t0 > fp32_after_s:
            log(f"FP32 experts left out: {time.perf_counter() - t0:.0f} s spent (limit {fp32_after_s:.0f} s)")
            continue
        what = f"{experts if cfg.is_moe_layer(li) else 'dense'}, {dn} dense projections"
        rig = None
        try:
            t = time.perf_counter()
            lay = layer(cfg, src, li, experts, dn, workers)
            rig = LayerRig(cfg, li, lay, max_rows, max_len)
            rig.sync()
            log(
                f"layer {li} ({what}): built in {time.perf_counter() - t:.1f} s, "
                f"paths {lay.moe.path if lay.moe is not None else lay.mlp.path}"
                + (f"; {_rss()}" if checkpoint else "")
            )
            if pool is not None and (li, experts, dn) in refs:
                engine_out[(li, experts, dn)] = engine_layer(cfg, seed, rig)
            full = experts in CHECKED                  # FP32 experts: at most 9 rows, 5 replays
            t = time.perf_counter()
            time_layer(
                cfg,
                rig,
                experts,
                context,
                ROWS if full else ROWS[:5],
                reps if full else 5,
                meta["copy_gbs"],
                emit,
                log,
                seed,
                budget_s=300.0 if full else 60.0,   # fused_moe compiles per row bucket (~50 s)
            )
            log(f"layer {li} ({what}): timed in {time.perf_counter() - t:.1f} s")
        except Exception as ex:  # noqa: BLE001 - keep the other layers
            log(f"layer {li} ({what}): FAILED {type(ex).__name__}: {ex}\n{traceback.format_exc()}")
        del rig
        lay = None
        cuda.current_context().deallocations.clear()
        torch.cuda.empty_cache()
        if torch_baseline and experts == ExpertKind.INT4 and dn == dense[0]:
            _torch_rows(cfg, seed, li, context, reps, emit, log)
        compare_ready(wait=False)
        save_meta()
    if progress is not None:
        progress(len(plan), len(plan), "checks")
    if pool is not None:
        log("waiting for the reference side of the checks")
        compare_ready(wait=True)
        pool.shutdown(cancel_futures=True)
    try:
        plot(rows, rs.plot)
    except Exception as ex:  # noqa: BLE001
        log(f"plot FAILED {type(ex).__name__}: {ex}")
    save_meta()
    log(
        f"checks: {sum(c['passed'] for c in checks)}/{len(checks)} passed; "
        f"wrote {rs.csv}, {rs.meta}, {rs.plot}"
    )
    return rs


def _rss() -> str:
    """This process's host memory: peak RSS, and the RSS now split into anonymous and file-backed pages
    (a mapped checkpoint's pages are file-backed, or shmem on tmpfs: the kernel drops the former under
    pressure)."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
        st = dict(line.split(":", 1) for line in lines if ":" in line)
        gb = {k: int(st[k].split()[0]) / 2 ** 20 for k in ("VmHWM", "RssAnon", "RssFile", "RssShmem")}
    except (OSError, KeyError, ValueError):
        return "host RSS unknown"
    return (f"host RSS peak {gb['VmHWM']:.1f} GiB (now anonymous {gb['RssAnon']:.1f}, "
            f"file-backed {gb['RssFile'] + gb['RssShmem']:.1f})")


@contextlib.contextmanager
def _blas_threads(n: int):
    """Processes spawned inside start their BLAS with ``n`` threads: the references share the host's
    cores with each other and with the expert repacking, and spinning BLAS threads beyond the cores
    slow every one of them."""
    names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    old = {k: os.environ.get(k) for k in names}
    os.environ.update({k: str(n) for k in names})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _torch_rows(cfg, seed, layer, context, reps, emit, log) -> None:
    """The stock-PyTorch BF16 layer's rows (time_torch_layer) on the same rows and random routing sets."""
    import torch

    from ..torchk2.layer import TorchLayer
    from .torch_layer_bench import time_torch_layer

    try:
        t = time.perf_counter()
        with torch.no_grad():
            tl = TorchLayer.from_seeded(cfg, seed, layer, max_len=context + max(ROWS))
            routes = {n: routing_sets(cfg, n, seed=seed) for n in ROWS} if cfg.is_moe_layer(layer) else None
            for r in time_torch_layer(cfg, tl, ROWS, context, layer, reps, seed, routes=routes):
                r = {
                    "layer": r["layer"],
                    "experts": "bf16" if cfg.is_moe_layer(layer) else "-",
                    "impl": r["impl"],
                    "part": r["part"],
                    "routing": "random" if r["part"] == "routed_experts" and routes else "router",
                    "rows": r["tokens"],
                    "tree_nodes": r["tokens"] - 1,
                    "context": r["context"],
                    "us": r["us"],
                    "min_us": r["min_us"],
                    "max_us": r["max_us"],
                    "unique_experts": r["unique_experts"],
                    "captured": r["captured"],
                }
                emit(r)
        log(f"layer {layer}: torch baseline in {time.perf_counter() - t:.1f} s")
        del tl
    except Exception as ex:  # noqa: BLE001
        log(f"layer {layer}: torch baseline FAILED {type(ex).__name__}: {ex}\n{traceback.format_exc()}")
    torch.cuda.empty_cache()


def plot(rows: list[dict], path: Path) -> None:
    """Per MoE layer: us vs tree rows of the layer and routed experts (INT4 and BF16 engine, BF16 torch,
    FP32 portable) and the floors; distinct experts vs the union model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..fileio import save_figure_atomic

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    denses = sorted({r.get("dense") or "fp32" for r in rows if r["impl"] == "numba engine"})
    for (impl, experts, part, routing), style in {
        ("numba engine", "int4", "layer", "router"): "o-",
        ("numba engine", "int4", "routed_experts", "random"): "s-",
        ("numba engine", "fp32", "routed_experts", "random"): "^-",
        ("numba engine", "bf16", "layer", "router"): "D-",
        ("numba engine", "bf16", "routed_experts", "random"): "v-",
    }.items():
        for layer, dense in sorted({(r["layer"], r.get("dense") or "fp32") for r in rows
                                    if r.get("experts") == experts}):
            sel = [
                r
                for r in rows
                if (r["impl"], r["experts"], r["part"], r["routing"], r["layer"], r.get("dense") or "fp32")
                == (impl, experts, part, routing, layer, dense)
            ]
            if sel:
                a.plot(
                    [r["rows"] for r in sel],
                    [r["us"] for r in sel],
                    style if dense == denses[0] else style.replace("-", "-."),
                    label=f"L{layer} {experts} {part}" + (f", {dense} dense" if len(denses) > 1 else ""),
                )
                if part == "routed_experts" and experts == "int4" and dense == denses[0]:
                    a.plot([r["rows"] for r in sel], [r["floor_us"] for r in sel], ":", color="gray")
                    b.plot(
                        [r["rows"] for r in sel],
                        [r["unique_experts"] for r in sel],
                        "o",
                        label=f"L{layer} random",
                    )
                    b.plot([r["rows"] for r in sel], [r["union_model"] for r in sel], "-", color="gray")
    for layer in sorted({r["layer"] for r in rows if r.get("experts") == "bf16"}):
        for part, style in (("layer", "o--"), ("routed_experts", "s--")):
            sel = [r for r in rows if r["experts"] == "bf16" and r["impl"].startswith("torch")
                   and r["part"] == part and r["layer"] == layer]
            if sel:
                a.plot(
                    [r["rows"] for r in sel],
                    [r["us"] for r in sel],
                    style,
                    label=f"L{layer} torch bf16 {part}",
                )
    a.set(
        xscale="log", yscale="log", xlabel="rows (tree nodes + root)", ylabel="us", title="k2_slice MoE layer"
    )
    b.set(xscale="log", xlabel="rows", ylabel="distinct experts", title="experts touched vs E(1-(1-k/E)^N)")
    a.legend(fontsize=6)
    b.legend(fontsize=6)
    fig.tight_layout()
    save_figure_atomic(fig, path)
    plt.close(fig)

"""The stock-PyTorch K2 layer (``torch_layer.TorchLayer``) on the seeded model: checked against the numpy
reference, and timed per part with CUDA graphs.

``python -m workbench.bench.torch_layer_bench --check --time`` (on the GPU) builds layer 0 (dense) and
layer 1 (MoE) of the seeded ``k2_slice`` in BF16 on the device, checks a decode step (and, for the MoE
layer, a 5-token tree verify) against the numpy reference (float32 on the same bf16 weights,
generated lazily: it materialises only the experts it routes to), then prints ``time_torch_layer``'s
rows. Exit status 0 when every check passes, 1 when one fails, 2 on bad arguments.

Timing (``time_torch_layer``): per token count N, each part (attention, router, routed experts,
shared expert or dense MLP, and the whole layer) is captured in its own CUDA graph at context length
``context`` (N new rows written after ``context`` cached ones, a random tree's ancestor mask,
positions context + depth) and replayed ``reps`` times; before each replay a 256 MiB write evicts
the L2 (weights come from HBM, as in a real decode step) and a spin kernel hides the host's
submission, so each sample is the GPU time of one replay (CUDA events). A part that does not
capture is timed eagerly behind a longer spin (``captured`` False). The routed experts run on the
router's own routing of the timed input.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ConfigError, ModelConfig, preset
from ..ddtree.scenarios import ancestor_inputs, layer_inputs, layer_reference, random_tree
from ..engine.scenarios import compare_layer
from ..errors import InputError
from ..torchk2.layer import TorchLayer

TOKENS = (1, 2, 4, 8, 16, 32, 64)
CHECK_NODES = 4                            # the verify check's random tree: 4 nodes + root
TOL = {"bfloat16": 3e-2, "float32": 1e-4}  # relative error of a token's update y - x and of cache rows


def _torch():
    import torch
    return torch


def build_layer(cfg: ModelConfig, weights: Any, layer: int, max_len: int, device: str = "cuda",
                dtype: Any = None) -> TorchLayer:
    """A BF16 ``TorchLayer`` from a weights mapping, or straight on the device from a ``SeededWeights``."""
    from ..seeded import SeededWeights
    torch = _torch()
    dtype = torch.bfloat16 if dtype is None else dtype
    if isinstance(weights, TorchLayer):
        return weights
    if isinstance(weights, SeededWeights):
        return TorchLayer.from_seeded(cfg, weights.seed, layer, device=device, dtype=dtype, max_len=max_len)
    if isinstance(weights, Mapping):
        return TorchLayer.from_weights(cfg, weights, layer, device=device, dtype=dtype, max_len=max_len)
    raise InputError(f"weights must be a mapping, SeededWeights or TorchLayer, got {type(weights).__name__}")


# ---- timing ----------------------------------------------------------------------------------------
def _timed(fn, reps: int, flush) -> tuple[list[float], bool]:
    """GPU microseconds of ``reps`` runs of ``fn``: graph replays when it captures, else eager."""
    from .common import SPIN_EAGER, capture_graph, spin_timed
    torch = _torch()
    try:
        g = capture_graph(fn)
    except RuntimeError:
        torch.cuda.synchronize()
        return spin_timed(fn, reps, spin=SPIN_EAGER, before=flush), False
    g.replay()
    torch.cuda.synchronize()
    return spin_timed(g.replay, reps, before=flush), True


def time_torch_layer(cfg: ModelConfig, weights: Any, tokens_list: Any = TOKENS, context: int = 4096,
                     layer: int | None = None, reps: int = 50, seed: int = 0,
                     routes: Mapping[int, Any] | None = None) -> list[dict[str, Any]]:
    """Rows {layer, part, tokens, context, us (median), min_us, max_us, captured, impl, unique_experts}
    for the BF16 torch layer on the GPU (see the module docstring for what is timed and how).

    ``weights``: a weights mapping with internal names, a ``workbench.seeded.SeededWeights`` (built on
    the GPU from the seeded generator, in chunks), or a ``TorchLayer`` already on the GPU. ``layer``
    defaults to the first MoE layer. ``routes`` (optional) maps a token count N to a list of expert-id
    sets [N, K]: the routed-experts part then rotates over them between replays (the same routing
    sets another benchmark times), with weights 1/K; otherwise it runs the router's own routing.
    ``unique_experts`` is the distinct routed experts of the timed routing (median over the sets).
    """
    torch = _torch()
    if not torch.cuda.is_available():
        raise InputError("time_torch_layer needs a CUDA GPU (torch.cuda.is_available() is False)")
    tokens = [int(n) for n in tokens_list]
    if not tokens or min(tokens) < 1:
        raise InputError(f"tokens_list must hold positive ints, got {tokens_list!r}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise InputError(f"context must be a non-negative int, got {context!r}")
    if layer is None:
        layer = weights.layer if isinstance(weights, TorchLayer) else cfg.first_k_dense_replace
    tl = build_layer(cfg, weights, layer, context + max(tokens))
    if tl.max_len < context + max(tokens) or tl.device.type != "cuda":
        raise InputError(f"the layer needs a CUDA cache of >= {context + max(tokens)} rows")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tl.cache[:context].normal_(generator=gen)                            # stands in for a prompt's latents
    flush_buf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def flush(r: int) -> None:
        flush_buf.zero_()
    rows: list[dict[str, Any]] = []
    for n in tokens:
        parents, _ = random_tree(cfg, n - 1, seed=n)
        vis, pos = ancestor_inputs(parents, context)
        x = torch.randn(n, cfg.hidden_size, device="cuda", generator=gen).to(tl.dtype)
        mask, positions = torch.from_numpy(vis).cuda(), torch.from_numpy(pos).cuda()
        xa = tl.normed(x)
        xf = tl.normed(x + tl.attention(xa, mask, positions, context), "ffn_norm")  # the layer's FFN input
        parts = {"attention": (lambda: tl.attention(xa, mask, positions, context), flush)}  # noqa: B023
        unique: dict[str, float | None] = {}
        if tl.is_moe:
            idx, w = tl.router(xf)
            unique["layer"] = unique["routed_experts"] = float(torch.unique(idx).numel())
            before = flush
            if routes is not None and routes.get(n):
                sets = [_route_set(torch, s, n, cfg) for s in routes[n]]
                idx = sets[0].clone()
                k = cfg.num_experts_per_tok
                w = torch.full((n, k), cfg.routed_scaling_factor / k, device="cuda")

                def before(r: int, sets=sets, idx=idx) -> None:
                    idx.copy_(sets[r % len(sets)])
                    flush_buf.zero_()
                unique["routed_experts"] = statistics.median(float(torch.unique(s).numel()) for s in sets)
            parts.update(router=(lambda: tl.router(xf), flush),                                   # noqa: B023
                         routed_experts=(lambda: tl.routed_experts(xf, idx, w), before),          # noqa: B023
                         shared_expert=(lambda: tl.shared_expert(xf), flush))                     # noqa: B023
        else:
            parts["dense_mlp"] = (lambda: tl.dense_mlp(xf), flush)                                # noqa: B023
        parts["layer"] = (lambda: tl.forward(x, mask, positions, context), flush)                 # noqa: B023
        for part, (fn, prep) in parts.items():
            samples, captured = _timed(fn, reps, prep)
            impl = "torch bf16 " + {"attention": "absorbed MLA", "router": "fp32 router",
                                    "routed_experts": f"{tl.moe_path}", "shared_expert": "matmuls",
                                    "dense_mlp": "matmuls", "layer": f"({tl.moe_path or 'dense'})"}[part]
            rows.append({"layer": layer, "part": part, "tokens": n, "context": context,
                         "us": round(statistics.median(samples), 2), "min_us": round(min(samples), 2),
                         "max_us": round(max(samples), 2), "captured": captured, "impl": impl,
                         "unique_experts": unique.get(part)})
        torch.cuda.synchronize()
    return rows


def _route_set(torch, s: Any, n: int, cfg: ModelConfig):
    t = torch.as_tensor(s).to("cuda", torch.int64)
    if tuple(t.shape) != (n, cfg.num_experts_per_tok):
        raise InputError(f"routes[{n}] sets must be [{n}, {cfg.num_experts_per_tok}], got {tuple(t.shape)}")
    return t


# ---- the check against the reference ------------------------------------------------------------------
def _np(t) -> np.ndarray:
    """A float32 host copy (never a view: the cache rows change under it)."""
    return t.detach().to("cpu", copy=True).float().numpy()


def torch_side(cfg: ModelConfig, seed: int, tl: TorchLayer, prefix: int = 16,
               tree_nodes: int = CHECK_NODES) -> dict[str, Any]:
    """The scenarios of ``ddtree.scenarios.layer_inputs`` on ``tl`` in the form
    ``engine.scenarios.compare_layer`` takes: the prefix's cache rows, and per step the update (added to
    the float32 inputs: the layer sees them rounded to its dtype), cache rows, routes and the torch
    router's own selection scores (its noise decides which routing flips are ties)."""
    torch = _torch()
    x_pre, cases = layer_inputs(cfg, seed, tl.layer, prefix, tree_nodes)
    dev = tl.device

    def run(x, vis, pos, start):
        tl.length = start
        x_t = torch.from_numpy(x).to(dev, tl.dtype)
        mask, positions = torch.from_numpy(np.asarray(vis, bool)).to(dev), torch.from_numpy(pos).to(dev)
        y_t = tl.step(x_t, mask, positions)
        step = {"y": x + (_np(y_t) - _np(x_t)), "rows": _np(tl.cache[start:start + x.shape[0]]),
                "routes": None}
        if tl.is_moe:                                 # the torch layer's own FFN input and routing
            h_t = x_t + tl.attention(tl.normed(x_t), mask, positions, start)
            xn_t = tl.normed(h_t, "ffn_norm")
            idx, _ = tl.router(xn_t)
            step["routes"] = idx.cpu().numpy()
            step["scores"] = _np((xn_t.float() @ tl.p["gate"].T).sigmoid() + tl.p["gate_bias"])
        return step
    with torch.no_grad():
        run(x_pre, np.tril(np.ones((prefix, prefix), bool)), np.arange(prefix), 0)
        out: dict[str, Any] = {"prefix_rows": _np(tl.cache[:prefix]), "steps": []}
        out["steps"] = [run(x, vis, pos, prefix) for _, x, vis, pos in cases]
    tl.length = prefix
    return out


def check_layer(cfg: ModelConfig, seed: int, tl: TorchLayer, prefix: int = 16, tree_nodes: int = CHECK_NODES,
                log=print) -> bool:
    """``tl`` (layer ``tl.layer`` of the seeded model ``seed``, the ``bf16`` layout's values) against the
    numpy reference on the same weights, by the one layer check (``engine.scenarios.compare_layer``): a
    ``prefix``-row causal prefill (cache rows), a decode step and a verify of a random ``tree_nodes``-node
    tree. True when every comparison is within TOL of the layer's dtype; a row whose routed experts
    differ within the two routers' score noise (a near-tie flipped by rounding) is left out."""
    from ..seeded import SeededWeights
    if tl.max_len < prefix + tree_nodes + 1:
        raise InputError(f"the layer's cache needs >= {prefix + tree_nodes + 1} rows for this check")
    tol = TOL.get(str(tl.dtype).removeprefix("torch."), 3e-2)
    ref = layer_reference(cfg, seed, tl.layer, prefix=prefix, tree_nodes=tree_nodes,
                          weights=SeededWeights(cfg, seed, "bf16"))
    log(f"layer {tl.layer} ({'MoE, ' + tl.moe_path if tl.is_moe else 'dense'}, {tl.dtype}, {tl.device}):")
    got = torch_side(cfg, seed, tl, prefix, tree_nodes)
    res = compare_layer(cfg, seed, tl.layer, "bf16", str(tl.dtype).removeprefix("torch."), got, ref, prefix,
                        tree_nodes, log, tol=tol)
    return all(r["passed"] for r in res)


# ---- command line -----------------------------------------------------------------------------------
def _ints(s: str) -> list[int]:
    try:
        return [int(v) for v in s.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want comma-separated ints, got {s!r}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.bench.torch_layer_bench",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="check against the numpy reference")
    ap.add_argument("--time", action="store_true", help="time the parts with CUDA graphs (GPU only)")
    ap.add_argument("--preset", default="k2_slice")
    ap.add_argument("--experts", type=int, default=None, help="override n_routed_experts (CPU smoke)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=_ints, default=None, help="default: the first dense and first MoE layer")
    ap.add_argument("--tokens", type=_ints, default=list(TOKENS))
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--csv", default=None, help="write the timing rows here too")
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except (InputError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    torch = _torch()
    if not (args.check or args.time):
        raise InputError("nothing to do: give --check and/or --time")
    cfg = preset(args.preset)
    if args.experts is not None:
        cfg = cfg.replace(n_routed_experts=args.experts)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("--device cuda but torch sees no CUDA GPU (use --device cpu for a CPU check)")
    if args.time and not args.device.startswith("cuda"):
        raise InputError("--time needs --device cuda")
    if args.csv and not Path(args.csv).resolve().parent.is_dir():
        raise InputError(f"--csv: no such directory {Path(args.csv).resolve().parent}")
    layers = args.layers
    if layers is None:
        layers = sorted({0, cfg.first_k_dense_replace} & set(range(cfg.num_hidden_layers)))
    print(f"{args.preset} (experts {cfg.n_routed_experts}), seed {args.seed}, torch {torch.__version__}, "
          f"device {torch.cuda.get_device_name() if args.device.startswith('cuda') else 'cpu'}")
    ok, rows = True, []
    max_len = max(args.context + max(args.tokens) if args.time else 0, 16 + CHECK_NODES + 1)
    for layer in layers:
        t0 = time.perf_counter()
        with torch.no_grad():
            tl = TorchLayer.from_seeded(cfg, args.seed, layer, device=args.device, max_len=max_len)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            print(f"layer {layer}: built in {time.perf_counter() - t0:.1f} s"
                  + (f" (moe path: {tl.moe_path})" if tl.is_moe else ""), flush=True)
            if args.check:
                t0 = time.perf_counter()
                ok &= check_layer(cfg, args.seed, tl)
                print(f"layer {layer}: checked in {time.perf_counter() - t0:.1f} s", flush=True)
            if args.time:
                t0 = time.perf_counter()
                new = time_torch_layer(cfg, tl, args.tokens, args.context, layer, args.reps, args.seed)
                rows += new
                _print_rows(new)
                print(f"layer {layer}: timed in {time.perf_counter() - t0:.1f} s", flush=True)
        del tl
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if args.csv and rows:
        from ..results import write_csv
        write_csv(rows, args.csv)
    print("check: " + ("PASS" if ok else "FAIL") if args.check else "done")
    return 0 if ok else 1


def _print_rows(rows: list[dict[str, Any]]) -> None:
    print(f"{'layer':>5} {'part':<15} {'tokens':>6} {'context':>7} {'us':>10} {'min_us':>10} {'graph':>5} "
          f"{'experts':>7}  impl")
    for r in rows:
        print(f"{r['layer']:>5} {r['part']:<15} {r['tokens']:>6} {r['context']:>7} {r['us']:>10.2f} "
              f"{r['min_us']:>10.2f} {'yes' if r['captured'] else 'no':>5} "
              f"{'' if r['unique_experts'] is None else r['unique_experts']:>7}  {r['impl']}")


if __name__ == "__main__":
    sys.exit(main())

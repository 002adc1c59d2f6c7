"""``python -m workbench bench engine``: the decode engine on the GPU, side by side in one run.

1. AR decode tokens/s: this engine (graph-replayed decode step) vs transformers'
   DeepseekV3ForCausalLM ``generate`` on the same weights and GPU (float32, eager, greedy); the INT4
   bundles on the kernels ``kernels_numba.ops`` picks, int4_tiny also on the portable kernels.
2. Per-token decode time (graph replay) vs the sum of its kernels' own device times
   (torch.profiler/CUPTI over eager decode steps).
3. Verify-step time against the budget (1 .. 256), next to the decode step, the device top-k and the
   host tree build.
4. DDTree tokens/s vs AR with the oracle drafter over p and budgets.
Writes the result set ``engine_<commit>.csv / .json / .png`` (workbench/results.py) under the
output folder (default reports/bench/).
"""

from __future__ import annotations

import functools
import tempfile
import time
from pathlib import Path

import numpy as np

from ..fileio import save_figure_atomic, write_json_atomic
from ..results import ResultSet, result_set, write_csv
from .common import require_gpu, run_metadata

AR_TOKENS = 256
HF_TOKENS = 64
SPEC_TOKENS = 192
BUDGETS_VERIFY = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BUDGETS_SPEC = (2, 4, 8, 16, 32, 64)
PS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def _bundle(name: str):
    from workbench.ddtree.config import DrafterConfig
    from workbench.refs import golden_bundle
    b = golden_bundle(name)
    return b, b.weights(), DrafterConfig.from_dict(b.meta["drafter"])


def _engine(cfg, w, p: int, n: int, budget: int, fast_kernels: bool = True):
    from workbench.engine.runtime import Engine
    return Engine(cfg, w, max_len=p + n + budget + 8, max_rows=max(p, budget + 1), fast_kernels=fast_kernels)


def bench_ar(name: str, rows: list[dict], fast_kernels: bool = True) -> dict:
    """Engine AR tokens/s (and HF's for FP32 bundles); returns the engine pieces for later sections.
    fast_kernels=False: the same INT4 bundle with every layer on the portable kernels (impl
    'engine, portable kernels')."""
    from workbench.generate import generate
    b, w, dcfg = _bundle(name)
    cfg, prompt = b.config, np.asarray(b.prompt, np.int64)
    eng = _engine(cfg, w, len(prompt), AR_TOKENS + 16, 0, fast_kernels)
    impl = "engine" if fast_kernels else "engine, portable kernels"
    generate(cfg, w, prompt, 8, backend="numba", engine=eng)               # capture + warm-up
    t: dict = {}
    res = generate(cfg, w, prompt, AR_TOKENS, backend="numba", engine=eng, timing=t)
    ok = bool(np.array_equal(res.tokens[:len(b.golden)], np.asarray(b.golden)))
    tps = (AR_TOKENS - 1) / t["decode_s"]
    rows.append(dict(section="ar", model=name, impl=impl, tokens=AR_TOKENS - 1, seconds=t["decode_s"],
                     tok_s=tps, us_per_token=1e6 / tps, golden_ok=ok,
                     kernels=" ".join(sorted({p for d in eng.model.paths() for p in d.values()}))))
    print(f"[ar] {name} {impl} {tps:,.0f} tok/s ({1e6 / tps:.1f} us/token), "
          f"golden {'ok' if ok else 'MISMATCH'}, FFN kernels {rows[-1]['kernels']}")
    if not any(k.endswith(".packed") for k in w):
        hf_tps, hf_match = bench_hf(cfg, w, prompt, res.tokens)
        rows.append(dict(section="ar", model=name, impl="hf_eager", tokens=HF_TOKENS,
                         seconds=HF_TOKENS / hf_tps,
                         tok_s=hf_tps, us_per_token=1e6 / hf_tps, golden_ok=hf_match))
        print(f"[ar] {name} HF eager {hf_tps:,.0f} tok/s; engine/HF = {tps / hf_tps:.1f}x; "
              f"HF tokens match engine: {hf_match}")
    return dict(b=b, w=w, dcfg=dcfg, eng=eng, tokens=res.tokens, tps=tps)


def bench_hf(cfg, w, prompt, engine_tokens) -> tuple[float, bool]:
    """transformers DeepseekV3ForCausalLM.generate (float32, eager attention, greedy) tokens/s."""
    import torch
    import transformers

    from workbench.hf_checkpoint import save_hf_checkpoint
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as d:
        target = {k: v for k, v in w.items() if not k.startswith("drafter.")}
        save_hf_checkpoint(Path(d) / "ckpt", cfg, target)
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                Path(d) / "ckpt", dtype=torch.float32, attn_implementation="eager")
        except (TypeError, ValueError):                          # older transformers: torch_dtype
            model = transformers.AutoModelForCausalLM.from_pretrained(
                Path(d) / "ckpt", torch_dtype=torch.float32, attn_implementation="eager")
        model = model.cuda().eval()
    ids = torch.tensor(prompt, device="cuda")[None]
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=8, min_new_tokens=8, **kw)            # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=HF_TOKENS, min_new_tokens=HF_TOKENS, **kw)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    gen = out[0, len(prompt):].cpu().numpy()
    n = min(len(gen), 16)
    return HF_TOKENS / dt, bool(np.array_equal(gen[:n], engine_tokens[:n]))


def bench_kernel_sum(ar: dict, rows: list[dict]) -> None:
    """Graph-replayed per-token time vs the sum of the decode step's kernel times (CUPTI, eager steps)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    eng = ar["eng"]
    step = eng.decode_step()
    reps = 20
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step.fn(eng.stream)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")]
    dev_us = sum(e.time_range.elapsed_us() for e in kernels)    # each kernel's own device duration
    per_token_kernels = dev_us / reps
    graph_us = 1e6 / ar["tps"]
    rows.append(dict(section="kernel_sum", model="tiny2", impl="engine",
                     kernels_per_token=len(kernels) / reps,
                     kernel_sum_us=per_token_kernels, us_per_token=graph_us,
                     ratio=graph_us / per_token_kernels if per_token_kernels else float("nan")))
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(_kernel_name(e.name), []).append(e.time_range.elapsed_us())
    for name, ts in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        rows.append(dict(section="kernel_breakdown", model="tiny2", impl=name,
                         launches_per_token=len(ts) / reps, us=sum(ts) / reps,
                         us_per_launch=sum(ts) / len(ts)))
        print(f"[kernels]   {name:28s} {len(ts) / reps:5.1f} launches/token {sum(ts) / reps:7.1f} us/token")
    print(f"[kernels] {len(kernels) / reps:.0f} kernels/token, sum {per_token_kernels:.1f} us, "
          f"graph step {graph_us:.1f} us, ratio {graph_us / max(per_token_kernels, 1e-9):.2f}")


_KERNELS = ("linear_kernel", "mla_attention_kernel", "mla_prep_kernel", "rmsnorm_kernel", "route_kernel",
            "up_f32_kernel", "down_f32_kernel", "up_i4_kernel", "down_i4_kernel", "embed_kernel",
            "argmax_kernel", "advance_kernel", "copy_rows_kernel", "kv_compact_kernel", "tree_compile_kernel",
            "int4_matmul_kernel", "moe_gemv_kernel", "moe_gemm_kernel", "moe_align_kernel",
            "moe_combine_kernel", "moe_act_kernel", "to_f16_kernel", "add_rows_kernel")


def _kernel_name(mangled: str) -> str:
    """The engine kernel's Python name inside numba's mangled symbol (or the symbol itself)."""
    for k in _KERNELS:
        if k in mangled:
            return k
    return mangled[:40]


def _events_us(fn, reps: int) -> float:
    import torch
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / reps


def bench_verify(name: str, rows: list[dict]) -> None:
    """Verify-step replay time vs budget, with the decode step, device top-k and host build beside it."""
    from kernels_numba.device import to_device, zeros
    from kernels_numba.ops import topk_logprobs
    from workbench.ddtree.budget import TreeBudget
    from workbench.ddtree.oracle import oracle_logits
    from workbench.engine.tree_host import build_tree_host
    b, w, dcfg = _bundle(name)
    cfg, p = b.config, len(b.prompt)
    n_pos = dcfg.block_size - 1
    eng = _engine(cfg, w, p, 64, max(BUDGETS_VERIFY))
    eng.prefill(np.asarray(b.prompt, np.int64))
    seq = np.concatenate([b.prompt, b.golden]).astype(np.int64)
    table = to_device(oracle_logits(seq, cfg.vocab_size, -1, 64, 0.8, 0))
    decode = eng.decode_step()
    eng.set_meta(p, 1, 0)
    rows.append(dict(section="verify", model=name, budget=0, rows=1,
                     us=_events_us(lambda: decode.run(eng.stream), 200)))
    for budget in BUDGETS_VERIFY:
        k = min(budget, cfg.vocab_size)
        lpk = zeros((2, n_pos, k), np.float64)
        topk_us = _events_us(functools.partial(topk_logprobs, lpk, table, p + 1, k, n_pos, eng.stream), 50)
        lpk_h = eng.fetch(lpk)
        lp_h, tk_h = lpk_h[0], lpk_h[1].astype(np.int32)
        ctl = np.zeros(eng.buf.ctl.shape, np.int32)
        scores = np.zeros(budget + 1, np.float64)
        fixed = TreeBudget(budget).host_cost
        build_tree_host(lp_h, tk_h, budget, n_pos, ctl, scores, *fixed)        # compiled before timing
        t0 = time.perf_counter()
        for _ in range(200):
            n = build_tree_host(lp_h, tk_h, budget, n_pos, ctl, scores, *fixed)
        build_us = (time.perf_counter() - t0) / 200 * 1e6
        ctl[4, :4] = (p, 0, 0, n + 1)
        step = eng.verify_step(budget)
        eng.put(eng.buf.ctl, ctl)
        us = _events_us(functools.partial(step.run, eng.stream), 100)
        rows.append(dict(section="verify", model=name, budget=budget, rows=n + 1, us=us, topk_us=topk_us,
                         build_us=build_us))
        print(f"[verify] {name} B={budget:3d}: verify {us:8.1f} us, top-k {topk_us:6.1f} us, "
              f"host build {build_us:6.1f} us")


def bench_spec(ar: dict, name: str, rows: list[dict]) -> None:
    """DDTree (oracle drafter) tokens/s over p and budget, against this engine's AR tokens/s."""
    from workbench.generate import generate
    b, w, dcfg = ar["b"], ar["w"], ar["dcfg"]
    cfg, prompt = b.config, np.asarray(b.prompt, np.int64)
    n_pos = dcfg.block_size - 1
    eng = _engine(cfg, w, len(prompt), SPEC_TOKENS + n_pos + 16, max(BUDGETS_SPEC))
    cont = generate(cfg, w, prompt, SPEC_TOKENS + n_pos + 1, backend="numba", engine=eng).tokens
    t: dict = {}
    ar_res = generate(cfg, w, prompt, SPEC_TOKENS, backend="numba", engine=eng, timing=t)
    ar_tps = (SPEC_TOKENS - 1) / t["decode_s"]
    rows.append(dict(section="spec", model=name, impl="ar", tokens=SPEC_TOKENS - 1, tok_s=ar_tps))
    for budget in BUDGETS_SPEC:
        spec = dict(backend="numba", mode="ddtree", drafter="oracle", budget=budget, drafter_config=dcfg,
                    continuation=cont, engine=eng)
        generate(cfg, w, prompt, 16, **spec)                                 # capture + warm-up
        for p in PS:
            t = {}
            r = generate(cfg, w, prompt, SPEC_TOKENS, oracle_p=p, oracle_seed=1, timing=t, **spec)
            ok = bool(np.array_equal(r.tokens, ar_res.tokens))
            tps = (SPEC_TOKENS - 1) / t["decode_s"]
            rows.append(dict(section="spec", model=name, impl="ddtree", budget=budget, p=p,
                             tokens=SPEC_TOKENS - 1,
                             tok_s=tps, speedup=tps / ar_tps, tau=r.mean_accepted, rounds=len(r.rounds),
                             build_us_per_round=t["build_s"] / len(r.rounds) * 1e6,
                             draft_us_per_round=t["draft_s"] / len(r.rounds) * 1e6,
                             verify_us_per_round=t["verify_s"] / len(r.rounds) * 1e6,
                             us_per_round=t["decode_s"] / len(r.rounds) * 1e6, tokens_equal_ar=ok))
            phases = ("decode_s", "draft_s", "build_s", "verify_s")
            per = {key: t[key] / len(r.rounds) * 1e6 for key in phases}
            print(f"[spec] {name} B={budget:2d} p={p:.1f}: {tps:8,.0f} tok/s ({tps / ar_tps:4.2f}x AR), "
                  f"tau {r.mean_accepted:.2f}, {per['decode_s']:6.1f} us/round (draft+top-k "
                  f"{per['draft_s']:5.1f}, build {per['build_s']:4.1f}, verify {per['verify_s']:5.1f}), "
                  f"equal to AR: {ok}")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    ar = [r for r in rows if r["section"] == "ar"]
    ax[0].bar([f"{r['model']}\n{r['impl']}" for r in ar], [r["tok_s"] for r in ar])
    ax[0].set_yscale("log")
    ax[0].set_ylabel("decode tokens/s")
    ax[0].set_title("AR decode: engine vs HF eager (same GPU)")
    ver = [r for r in rows if r["section"] == "verify" and r["budget"] > 0]
    for model in sorted({r["model"] for r in ver}):
        sel = [r for r in ver if r["model"] == model]
        ax[1].plot([r["budget"] for r in sel], [r["us"] for r in sel], "o-", label=f"{model} verify")
        ax[1].plot([r["budget"] for r in sel], [r["build_us"] + r["topk_us"] for r in sel], "x--",
                   label=f"{model} top-k + host build")
        dec = [r["us"] for r in rows if r["section"] == "verify" and r["budget"] == 0 and r["model"] == model]
        if dec:
            ax[1].axhline(dec[0], ls=":", color="gray", label=f"{model} decode step")
    ax[1].set_xscale("log", base=2)
    ax[1].set_xlabel("budget B (verify rows = B + 1)")
    ax[1].set_ylabel("us")
    ax[1].set_title("verify step vs budget")
    ax[1].legend(fontsize=7)
    spec = [r for r in rows if r["section"] == "spec" and r["impl"] == "ddtree"]
    for budget in sorted({r["budget"] for r in spec}):
        sel = [r for r in spec if r["budget"] == budget]
        ax[2].plot([r["p"] for r in sel], [r["tok_s"] for r in sel], "o-", label=f"B={budget}")
    for r in rows:
        if r["section"] == "spec" and r["impl"] == "ar":
            ax[2].axhline(r["tok_s"], color="k", ls="--", label="AR")
    ax[2].set_xlabel("oracle p")
    ax[2].set_ylabel("tokens/s")
    ax[2].set_title("DDTree (oracle) vs AR")
    ax[2].legend(fontsize=7)
    fig.tight_layout()
    save_figure_atomic(fig, path, dpi=110)
    plt.close(fig)


def run_engine_bench(out_dir, progress=None) -> ResultSet:
    """The engine benchmark's result set; progress: ``progress(done, total, what)`` per part."""
    require_gpu()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = run_metadata(bench="engine", ar_tokens=AR_TOKENS, hf_tokens=HF_TOKENS, spec_tokens=SPEC_TOKENS)
    rs = result_set(out, "engine", meta["git_sha"])       # the commit before any result lands in the tree
    rows: list[dict] = []
    step = progress or (lambda done, total, what: None)
    step(0, 7, "AR tiny2")
    ar = bench_ar("tiny2", rows)
    step(1, 7, "kernel sum tiny2")
    bench_kernel_sum(ar, rows)
    step(2, 7, "AR int4_tiny2")
    bench_ar("int4_tiny2", rows)                     # dense MLP on int4_matmul, experts portable (width 32)
    step(3, 7, "AR int4_tiny")
    bench_ar("int4_tiny", rows)                      # dense MLP on int4_matmul, experts on fused_moe
    step(4, 7, "AR int4_tiny, portable kernels")
    bench_ar("int4_tiny", rows, fast_kernels=False)  # the same bundle on the portable kernels
    step(5, 7, "verify tiny2")
    bench_verify("tiny2", rows)
    step(6, 7, "DDTree tiny2")
    bench_spec(ar, "tiny2", rows)
    step(7, 7, "done")
    write_csv(rows, rs.csv)
    write_json_atomic(rs.meta, meta, indent=2)
    try:
        plot(rows, rs.plot)
    except Exception as e:                                   # noqa: BLE001 - the CSV/JSON are the results
        print(f"plot failed: {type(e).__name__}: {e}")
    print(f"wrote {rs.csv}, {rs.meta}, {rs.plot}")
    return rs

"""A tiny INT4 MoE layer for the expert-parallel tests, and the rank function they spawn.

The ranks join over gloo with the kernels in the CUDA simulator (CI), or over NCCL, one GPU a rank, in
the GPU tier (KDTREE_GPU=1), where a world size needs as many GPUs (``worlds``)."""

from __future__ import annotations

import numpy as np
import pytest

from kernels_numba import ops
from kernels_numba.device import SIMULATED, to_device
from workbench.config import preset
from workbench.quant.int4 import gen_quant4

BACKEND = "gloo" if SIMULATED else "nccl"
DEVICE = "cpu" if SIMULATED else "cuda"


def worlds(*ps: int, slow: tuple = ()) -> list:
    """World sizes as test parameters (those in ``slow`` marked slow); on the GPU tier, skipped beyond
    the GPUs present."""
    gpus = None
    if not SIMULATED:
        import torch
        gpus = torch.cuda.device_count()
    return [pytest.param(p, marks=[*([pytest.mark.slow] if p in slow else []),
                                   pytest.mark.skipif(gpus is not None and p > gpus,
                                                      reason=f"NCCL: needs {p} GPUs, {gpus} present")])
            for p in ps]


# D 128, I 64 (fused_moe's widths: multiples of 64), G 32, 16 experts top-4, one shared expert of 64
CFG = preset("tiny").replace(n_routed_experts=16, num_experts_per_tok=4)
LAYER = 1


def weights(seed: int, banned: tuple = ()) -> dict:
    """Layer LAYER's MoE in reference names; experts in ``banned`` get selection bias -10 (never chosen)."""
    cfg, rng = CFG, np.random.default_rng(seed)
    e, i, d = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
    p, w = f"layers.{LAYER}.ffn", {}
    mats = [*((f"{p}.experts.{j}", i) for j in range(e)), (f"{p}.shared", i * cfg.n_shared_experts)]
    for pre, width in mats:
        for nm, (n, k) in (("w1", (width, d)), ("w3", (width, d)), ("w2", (d, width))):
            _, pk, sc = gen_quant4(n, k, 32, seed=int(rng.integers(1 << 30)))
            w[f"{pre}.{nm}.packed"], w[f"{pre}.{nm}.scale"] = pk, sc
    w[f"{p}.gate"] = (rng.standard_normal((e, d)) * 0.1).astype(np.float32)
    bias = (rng.standard_normal(e) * 0.01).astype(np.float32)
    bias[list(banned)] = -10.0
    w[f"{p}.gate_bias"] = bias
    return w


def _host(w: dict, name: str) -> ops.Int4Host:
    return ops.Int4Host(w[name + ".packed"], w[name + ".scale"])


def _swiglu(w: dict, pre: str) -> tuple:
    return tuple(_host(w, f"{pre}.{m}") for m in ("w1", "w3", "w2"))


def router(w: dict) -> ops.Router:
    c, p = CFG, f"layers.{LAYER}.ffn"
    return ops.router(w[p + ".gate"], w[p + ".gate_bias"], c.num_experts_per_tok, c.n_group, c.topk_group,
                      c.norm_topk_prob, c.routed_scaling_factor)


def ep_parts(w: dict, world: int, rank: int):
    from workbench.parallel.ep_moe import ep_weights
    from workbench.parallel.experts import ExpertSplit
    split = ExpertSplit(CFG.n_routed_experts, world)
    p = f"layers.{LAYER}.ffn"
    rt = router(w)
    local = ops.moe_weights(rt, [_swiglu(w, f"{p}.experts.{j}") for j in split.experts(rank)], None)
    assert local.path == ops.FUSED_MOE
    return ep_weights(split, rank, rt, local.fused, ops.swiglu_weights(*_swiglu(w, p + ".shared")))


def single_process(w: dict, h: np.ndarray, x: np.ndarray) -> np.ndarray:
    """h + ops.moe(x) on one process, all experts (the shared expert fused in): the baseline."""
    from kernels_numba.device import download
    from kernels_numba.sim import sim_speed
    p, t = f"layers.{LAYER}.ffn", x.shape[0]
    rt = router(w)
    m = ops.moe_weights(rt, [_swiglu(w, f"{p}.experts.{j}") for j in range(CFG.n_routed_experts)],
                        _swiglu(w, p + ".shared"))
    assert m.path == ops.FUSED_MOE and m.fused.n_shared == 1
    sc = ops.Scratch(t, [], [m])
    sc.reserve(t)
    hd, xd = to_device(h), to_device(x)
    with sim_speed():
        ops.moe(hd, xd, m, sc, to_device(np.array([0, t, 0, 0, 0, 0, 0, 0], np.int32)), t)
    return download(hd)


def rank_main(rank: int, world: int, seed: int, cases: list) -> list:
    """Every case on this rank: (h after the block, rows received per source rank)."""
    import torch

    from kernels_numba.sim import sim_speed
    from workbench.parallel.ep_moe import EPMoE
    from workbench.parallel.phases import PhaseTimer
    out, blocks = [], {}
    with sim_speed():
        for c in cases:
            key = tuple(c["banned"])
            if key not in blocks:
                blocks[key] = EPMoE(ep_parts(weights(seed, key), world, rank), max_rows=32, device=DEVICE)
            block = blocks[key]
            h, x = (torch.from_numpy(c[k].copy()).to(DEVICE) for k in ("h", "x"))
            timer = PhaseTimer(cuda=not SIMULATED)
            timer.start()
            block(h, x, timer)
            out.append({"h": h.cpu().numpy(), "got": block.last.got, "phases": sorted(timer.times_us())})
    return out


def misbehave(rank: int, world: int, mode: str) -> int:
    """Rank 1 raises (``fail``) or every rank sleeps (``hang``); rank 0 waits for rank 1 in a barrier."""
    import time

    import torch.distributed as dist
    if mode == "hang":
        time.sleep(600)
    if rank == 1:
        raise ValueError("rank 1 gives up")
    dist.barrier()
    return rank



# the stack: tiny's 1 dense + 2 MoE layers (D 128, expert width 64, 8 experts top-2, one shared expert),
# routed experts INT4 (G 32), the rest FP32 (Kimi-K2's layout)
STACK_CFG = preset("tiny").replace(num_hidden_layers=3)
PROMPT = np.array([3, 141, 59], np.int64)
DECODE = 3                    # tokens of the AR run: the prefill's, then 2 decode steps
BUDGET = 4                    # the verify: a tree of up to 4 nodes + root


def stack_weights(seed: int) -> dict:
    from workbench.quant.policy import quantize_weights
    from workbench.weights import random_weights
    q, _ = quantize_weights(STACK_CFG, random_weights(STACK_CFG, seed), policy="experts", group_size=32)
    return q


class FlatDrafter:
    """Draft logits ~ N(0, 0.1^2) seeded by (seed, position): no token stands out, so the best-first
    tree has siblings (the verify's ancestor-only mask is not a causal one)."""
    capture: tuple = ()
    block_size = 4

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def propose(self, state) -> np.ndarray:
        rng = np.random.default_rng([self.seed, state.start])
        return (0.1 * rng.standard_normal((self.block_size - 1, STACK_CFG.vocab_size))).astype(np.float32)


def stack_steps(eng, seed: int) -> dict:
    """On ``eng``: a greedy AR run (prefill + decode steps, logits per step), then from a fresh prefill
    one DDTree round (``FlatDrafter``): the prefill's logits, the verify's tree, logits and argmax."""
    from kernels_numba.device import head_rows
    from kernels_numba.sim import sim_speed
    from workbench.ddtree.budget import TreeBudget
    from workbench.ddtree.config import GREEDY
    from workbench.engine.ar import engine_ar_generate
    from workbench.engine.rounds import EngineSpecState
    ar = engine_ar_generate(eng, PROMPT, DECODE, return_logits=True)
    with sim_speed():
        state = EngineSpecState(eng, FlatDrafter(seed), TreeBudget(BUDGET), GREEDY, PROMPT)
        prefill = eng.fetch(head_rows(eng.buf.logits, len(PROMPT)))
        state.draft()
        n = state.build_tree()
        post = state.verify(n)
        verify = eng.fetch(head_rows(eng.buf.logits, n + 1))
    return {"tokens": ar.tokens, "logits": ar.logits, "prefill": prefill, "verify": verify,
            "tree": state.ctl[:3, :n + 1].copy(), "post": np.array(post)}


def stack_rank(rank: int, world: int, seed: int) -> dict:
    """``stack_steps`` on this rank's engine of the expert-parallel stack."""
    from workbench.parallel.ep_stack import ep_engine
    eng = ep_engine(STACK_CFG, stack_weights(seed), max_len=len(PROMPT) + 16,
                    max_rows=max(len(PROMPT), BUDGET + 1))
    out = stack_steps(eng, seed)
    out["received"] = {i: sum(b.last.got) for i, b in eng.ep_blocks.items()}
    return out

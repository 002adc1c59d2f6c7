"""A tiny INT4 MoE layer for the expert-parallel tests, and the rank function they spawn."""

from __future__ import annotations

import numpy as np

from kernels_numba import ops
from kernels_numba.device import to_device
from workbench.config import preset
from workbench.quant.int4 import gen_quant4

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
                blocks[key] = EPMoE(ep_parts(weights(seed, key), world, rank), max_rows=32)
            block = blocks[key]
            h, x = torch.from_numpy(c["h"].copy()), torch.from_numpy(c["x"].copy())
            timer = PhaseTimer(cuda=False)
            timer.start()
            block(h, x, timer)
            out.append({"h": h.numpy(), "got": block.last.got, "phases": sorted(timer.times_us())})
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
